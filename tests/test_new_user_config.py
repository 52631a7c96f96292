"""Issue #43 section 3, config errors a new user met: a value of the wrong type for a ``_target_``'s parameter
(``optim.lr=abc``, ``model.channels=16``) and a rater target on a dataset without raters are refused at start,
in one line naming the key and what was expected, not by a torch or MONAI traceback an epoch later."""
from __future__ import annotations

import pytest

from mcseg.config import validate_train_config
from mcseg.errors import ConfigError

from .conftest import TINY_2D, run_cli


@pytest.mark.parametrize("override,expected", [
    ("optim.lr=abc", r"config key 'optim.lr'=.abc.: expected a number"),
    ("optim.lr=[0.1]", r"config key 'optim.lr'=\[0.1\]: expected a number"),
    ("model.channels=16", r"config key 'model.channels'=16: expected a list of integers"),
    ("model.strides=[2,x]", r"config key 'model.strides'=\[2, 'x'\]: expected a list of integers"),
    ("loss.ignore_index=abc", r"config key 'loss.ignore_index'=.abc.: expected an integer"),
])
def test_a_value_of_the_wrong_type_for_a_target_is_named_at_start(make_cfg, override, expected):
    cfg = make_cfg(TINY_2D + [override])
    with pytest.raises(ConfigError, match=expected):
        validate_train_config(cfg)


@pytest.mark.parametrize("override", ["optim.lr=1", "optim.lr=0.01", "model.channels=[4,8,16]", "optim=sgd",
                                      "loss=margin", "loss.ignore_index=null"])
def test_values_of_the_right_type_pass(make_cfg, override):
    validate_train_config(make_cfg(TINY_2D + [override]))


def test_a_wrong_type_ends_the_cli_in_one_line_naming_the_key(tmp_path):
    done = run_cli("train.py", TINY_2D + ["optim.lr=abc", f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode != 0
    message = done.stderr + done.stdout
    assert "config key 'optim.lr'='abc': expected a number" in message
    assert "Traceback" not in message


@pytest.mark.parametrize("target", ["mean", "staple", "random", "seg01", "majorty"])
def test_a_rater_target_on_a_dataset_without_raters_is_refused_at_start(make_cfg, tmp_path, monkeypatch, target):
    """``dataset.raters.target=mean`` (or a misspelt target) on single-rater data trained bitwise the plain run and
    showed in the report as another configuration; now refused before training, naming the key."""
    from mcseg.train import train

    from .fake_datasets import write_msd
    from .test_bad_input import MSD_TINY

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    root = write_msd(tmp_path / "msd", n_cases=4)
    cfg = make_cfg(MSD_TINY + [f"dataset.root={root}", f"dataset.raters.target={target}", "trainer.device=cpu",
                               "loss=margin"])
    with pytest.raises(ConfigError, match=rf"config key 'dataset.raters.target'={target}: .* no case .* several "
                                          r"raters.*majority"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_default_rater_target_on_a_dataset_without_raters_is_no_error(make_cfg, tmp_path, monkeypatch):
    from mcseg.data.build import build_dataset, check_run_inputs, resolve_split

    from .fake_datasets import write_msd
    from .test_bad_input import MSD_TINY

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    root = write_msd(tmp_path / "msd", n_cases=4)
    cfg = make_cfg(MSD_TINY + [f"dataset.root={root}", "dataset.raters.target=majority"])
    dataset = build_dataset(cfg.dataset)
    check_run_inputs(cfg, dataset, resolve_split(dataset, cfg.dataset, tmp_path))

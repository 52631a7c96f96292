"""The ``conformal`` node of evaluate.py and train.py: off by default, typed, and refused where no guarantee can
hold (a training without validation cases: at its start)."""
from __future__ import annotations

import pytest

from mcseg.config import typed
from mcseg.errors import ConfigError
from mcseg.evaluation.conformal import ConformalConfig, check_conformal
from tests.conftest import compose_config


def test_the_default_node_composes_off_and_typed(tmp_path):
    cfg = compose_config("evaluate", ["ckpt=x"], tmp_path)
    config = typed(cfg.conformal, ConformalConfig, "conformal")
    assert config == ConformalConfig() and not config.enabled
    settings = typed({"classes": ["core"], "method": "rcps"}, ConformalConfig, "conformal").settings(
        ["background", "crescent", "core"], False)
    assert settings.classes == [2] and settings.delta == 0.1
    assert ConformalConfig().settings(["background", "a", "b"], False).classes == [1, 2]


@pytest.mark.parametrize("node,message", [
    ({"method": "cqr"}, "conformal.method': expected one of crc, rcps, ltt"),
    ({"alpha": 1.5}, "conformal.alpha': expected 0 < alpha < 1"),
    ({"delta": 0.1}, "conformal.delta': belongs to method rcps or ltt"),
    ({"alhpa": 0.1}, "conformal.alhpa"),
    ({"loss": "fdr"}, r"conformal.loss'=fdr with conformal.method=crc: .*not non-decreasing.*conformal.method=ltt"),
    ({"loss": "fdr", "method": "rcps", "delta": 0.1}, r"conformal.loss'=fdr with conformal.method=rcps"),
])
def test_bad_values_are_refused_naming_the_key(node, message):
    with pytest.raises(ConfigError, match=message):
        typed(node, ConformalConfig, "conformal")


def test_refused_without_validation_cases_or_on_another_split_than_test():
    on = ConformalConfig(enabled=True)
    split = {"train": ["a"], "val": ["b", "c"], "test": ["d"]}
    check_conformal(on, "test", split)
    check_conformal(ConformalConfig(), "val", None)  # off: nothing to refuse
    with pytest.raises(ConfigError, match="split=val: the guarantee is for new cases"):
        check_conformal(on, "val", split)
    with pytest.raises(ConfigError, match="split=all"):
        check_conformal(on, "all", split)
    with pytest.raises(ConfigError, match="no validation split"):
        check_conformal(on, "test", {"train": ["a"], "val": [], "test": ["d"]})
    with pytest.raises(ConfigError, match="class names? .*nope|nope"):
        ConformalConfig(classes=["nope"]).settings(["background", "a"], False)


def test_headline_block_means_over_classes():
    from mcseg.evaluation.conformal import headline

    record = {"alpha": 0.1, "method": "crc", "loss": "fnr",
              "classes": {c: {"threshold": t, "controlled": True, "n_cases": 9,
                              "margin": {"outer_mm": 2.0, "inner_mm": None}} for c, t in (("a", 0.2), ("b", 0.3))},
              "test": {"a": {"mean_loss": 0.05, "mean_set_over_prediction": 1.5, "covered": 1.0, "sure_inside": 0.5},
                       "b": {"mean_loss": 0.15, "mean_set_over_prediction": None, "covered": 0.5,
                             "sure_inside": 1.0}}}
    block = headline(record)
    assert block["mean_test_loss"] == pytest.approx(0.1) and block["mean_set_over_prediction"] == 1.5
    assert block["classes"]["b"] == {"threshold": 0.3, "controlled": True, "n_cases": 9, "outer_mm": 2.0,
                                     "inner_mm": None, "test_loss": 0.15, "set_over_prediction": None,
                                     "covered": 0.5, "sure_inside": 1.0}


def test_a_training_without_validation_cases_is_refused_at_its_start(tmp_path):
    """The conformal pass of a run's test evaluation fits on its validation cases: none is said before any training
    step, naming the key that left none (not after the training, by the test evaluation), and writes nothing."""
    from mcseg.train import train
    from tests.conftest import TINY_2D

    run = tmp_path / "run"
    cfg = compose_config("train", [*TINY_2D, "logger=none", "conformal.enabled=true", "dataset.split.val_fraction=0",
                                   "posthoc.fit=[]", "posthoc.apply=[]"], run)
    with pytest.raises(ConfigError, match=r"conformal.enabled.*dataset.split.val_fraction=0"):
        train(cfg)
    # nothing written: no split.json, which the corrected launch (val_fraction=0.2) would otherwise take as its own
    assert not run.exists() or sorted(p.name for p in run.iterdir()) == []


def test_a_loss_its_method_cannot_control_is_refused_before_the_training(tmp_path, monkeypatch):
    """``conformal.loss=fdr`` with the default CRC: refused by train() before anything is built (not by the test
    evaluation's conformal pass after the training), and by an evaluation's check before anything is written."""
    import mcseg.train
    from mcseg.evaluation.conformal import check_conformal, conformal_config
    from tests.conftest import TINY_2D

    def built(cfg):
        raise AssertionError("build_run was reached: the conformal node was not checked at start")

    monkeypatch.setattr(mcseg.train, "build_run", built)
    cfg = compose_config("train", [*TINY_2D, "conformal.enabled=true", "conformal.loss=fdr"], tmp_path / "run")
    with pytest.raises(ConfigError, match=r"conformal.loss'=fdr"):
        mcseg.train.train(cfg)
    cfg = compose_config("evaluate", ["ckpt=x", "split=test", "conformal.enabled=true", "conformal.loss=fdr"],
                         tmp_path)
    with pytest.raises(ConfigError, match=r"conformal.loss'=fdr"):
        check_conformal(conformal_config(cfg), "test", {"train": ["a"], "val": ["b"], "test": ["c"]})
    from mcseg.evaluate import evaluate

    with pytest.raises(ConfigError, match=r"conformal.loss'=fdr"):  # before the checkpoint (here none) is read
        evaluate(cfg)
    cfg = compose_config("evaluate", ["ckpt=x", "split=test", "conformal.enabled=true", "conformal.loss=fdr",
                                      "conformal.method=ltt", "conformal.delta=0.1"], tmp_path)
    config = conformal_config(cfg)
    check_conformal(config, "test", {"train": ["a"], "val": ["b"], "test": ["c"]})  # LTT controls it: no refusal
    assert config.loss == "fdr"

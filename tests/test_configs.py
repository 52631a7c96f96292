"""Every config option composes and builds; bad keys fail at start naming the key."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from mcseg.config import validate_train_config
from mcseg.errors import ConfigError
from mcseg.models import final_output

from .conftest import CONFIG_DIR, TINY_2D

GROUPS = ["dataset", "model", "loss", "optim", "scheduler", "trainer", "inference", "evaluation", "logger", "debug"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "group,option", [(g, o) for g in GROUPS for o in options(g)], ids=lambda v: str(v)
)
def test_every_option_composes_and_validates(make_cfg, tmp_path, group, option):
    cfg = make_cfg([f"{group}={option}"])
    if group != "debug":  # debug presets are global deltas, not a node of their own
        assert cfg[group] is not None
    if group == "dataset" and option == "msd":  # its root is mandatory (???); validating never reads it
        with open_dict(cfg):
            cfg.dataset.root = str(tmp_path / "msd_root_never_read")
    validate_train_config(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("option", options("model"))
@pytest.mark.parametrize("dims", [2, 3])
def test_every_model_builds_and_runs(make_cfg, option, dims):
    if option in ("mbls_unet", "upconv_unet") and dims == 3:
        pytest.skip("mcseg's own U-Nets are 2D only")
    # a multiple of every preset's size divisor (UNETR's img_size follows it); SwinUNETR's bottleneck,
    # 1/32 of the input and instance-normalised, needs two voxels
    size = [32] * (dims - 1) + [64 if option == "swin_unetr" else 32]
    patch = ",".join(map(str, size))
    cfg = make_cfg([f"model={option}", f"dataset.sampling.dims={dims}", f"dataset.sampling.patch_size=[{patch}]"])
    model = instantiate(cfg.model).eval()  # at the preset's own sizes (tests/test_backbones.py trains tiny ones)
    with torch.no_grad():
        out = final_output(model(torch.randn(1, cfg.dataset.in_channels, *size)))
    assert out.shape == (1, cfg.dataset.num_classes, *size)


@pytest.mark.parametrize("option", options("loss"))
def test_every_loss_builds_and_runs(make_cfg, option):
    cfg = make_cfg([f"loss={option}"])
    loss = instantiate(cfg.loss)
    k = cfg.dataset.num_classes
    logits = torch.randn(2, k, 8, 8, requires_grad=True)
    if getattr(loss, "multilabel", False):
        target = torch.randint(0, 2, (2, k, 8, 8)).float()
    else:
        target = torch.randint(0, k, (2, 8, 8))
    value = loss(logits, target)
    value.backward()
    assert value.ndim == 0 and torch.isfinite(value)


@pytest.mark.parametrize("optim", options("optim"))
@pytest.mark.parametrize("scheduler", options("scheduler"))
def test_optimisers_and_schedulers_build(make_cfg, optim, scheduler):
    cfg = make_cfg([f"optim={optim}", f"scheduler={scheduler}"])
    params = [torch.nn.Parameter(torch.zeros(3))]
    opt = instantiate(cfg.optim)(params=params)
    sched = instantiate(cfg.scheduler)(optimizer=opt)
    opt.step()
    sched.step()


@pytest.mark.parametrize("overrides", [[], ["ckpt=a/checkpoints/best.pt", "runs=a"]])
def test_evaluate_needs_exactly_one_of_ckpt_and_runs(make_cfg, overrides):
    from mcseg.errors import ConfigError
    from mcseg.evaluate import evaluate

    with pytest.raises(ConfigError, match="exactly one of ckpt=.* or runs="):
        evaluate(make_cfg(overrides, config_name="evaluate"))


def _set_key(cfg, path: str, value) -> None:
    """Write ``path`` even where it is not a known key, as a user's YAML file could."""
    node_path, _, key = path.rpartition(".")
    node = OmegaConf.select(cfg, node_path)
    with open_dict(node):
        node[key] = value


@pytest.mark.parametrize(
    "path,value,expected",
    [
        ("trainer.max_epoch", 3, "trainer.max_epoch"),
        ("dataset.sampling.batchsize", 2, "dataset.sampling.batchsize"),
        ("loss.margn", 5.0, "loss.margn"),
        ("model.chanels", [8], "model.chanels"),
        ("evaluation.regoin", "all", "evaluation.regoin"),
        ("dataset.nosie", 0.1, "dataset.nosie"),
    ],
)
def test_misspelt_key_in_a_yaml_is_named(make_cfg, path, value, expected):
    cfg = make_cfg(TINY_2D + (["loss=margin"] if path.startswith("loss") else []))
    _set_key(cfg, path, value)
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        validate_train_config(cfg)


@pytest.mark.parametrize(
    "path,value,expected",
    [("trainer.max_epochs", "many", "trainer.max_epochs"), ("dataset.sampling.patch_size", "big", "patch_size")],
)
def test_wrong_type_is_named(make_cfg, path, value, expected):
    cfg = make_cfg(TINY_2D)
    _set_key(cfg, path, value)
    with pytest.raises(ConfigError, match=expected):
        validate_train_config(cfg)

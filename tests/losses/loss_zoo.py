"""The softmax losses under test, with settings that make every term active on random logits."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from mcseg import losses as L
from mcseg.losses.base import SegmentationLoss
from mcseg.losses.lagrangian import AugmentedLagrangianLoss
from mcseg.losses.multilabel import MultiLabelLoss

NUM_CLASSES = 3


@dataclass(frozen=True)
class Case:
    cls: type
    kwargs: dict[str, Any] = field(default_factory=dict)
    per_voxel: bool = True  # a mean over voxels of a per-voxel quantity (no Dice, no neighbourhood)
    spatial: bool = False  # uses the neighbourhood (2D/3D only)

    def make(self, **overrides: Any) -> torch.nn.Module:
        return self.cls(**{**self.kwargs, **overrides})


SOFTMAX_CASES: dict[str, Case] = {
    "ce": Case(L.CELoss),
    "ce_dice": Case(L.CEDiceLoss, per_voxel=False),
    "ce_dice_nobg_batch": Case(L.CEDiceLoss, {"include_background": False, "batch": True}, per_voxel=False),
    "focal": Case(L.FocalLoss),
    "flsd": Case(L.FLSDLoss, {"threshold": 0.4}),
    "dual_focal": Case(L.DualFocalLoss, {"gamma": 2.0}),
    "ecp": Case(L.ECPLoss),
    "ls": Case(L.LabelSmoothingLoss),
    "svls": Case(L.SVLSLoss, spatial=True),
    "margin": Case(L.MarginLoss, {"margin": 1.0}),
    "margin_dice": Case(L.MarginDiceLoss, {"margin": 1.0}, per_voxel=False),
    "nacl": Case(L.NACLLoss, spatial=True),
    "nacl_svls_l2": Case(L.NACLLoss, {"kernel": "svls", "padding": "replicate", "distance": "l2"}, spatial=True),
    "nacl_gauss_zeros": Case(L.NACLLoss, {"kernel": "gaussian", "padding": "zeros"}, spatial=True),
    "cals": Case(L.CALSLoss, {"num_classes": NUM_CLASSES, "margin": 1.0}),
    "crac": Case(L.CRaCLoss, {"num_classes": NUM_CLASSES}, spatial=True),
    "fcl": Case(L.FCLLoss),
    "fcl_adaptive": Case(L.FCLLoss, {"self_adaptive": True}),
    "brier": Case(L.BrierLoss),
    "hardl1ace_ce": Case(L.L1ACELoss, per_voxel=False),
    "softl1ace_dice_ce": Case(
        L.L1ACELoss,
        {"binning": "soft", "lambda_dice": 0.33, "squared_pred": True, "smooth_nr": 0.0},
        per_voxel=False,
    ),
    "l1ace_exclude_nobg": Case(
        L.L1ACELoss, {"empty_classes": "exclude", "include_background": False}, per_voxel=False
    ),
    "mdca": Case(L.MDCALoss, per_voxel=False),
    "mdca_focal": Case(L.MDCALoss, {"classification": "focal", "gamma": 2.0}, per_voxel=False),
    "mdca_ls": Case(L.MDCALoss, {"classification": "ls"}, per_voxel=False),
    "dca": Case(L.DCALoss, per_voxel=False),
    "acls": Case(L.ACLSLoss, {"margin": 1.0}),
    "adafocal": Case(L.AdaFocalLoss),
    "dml": Case(L.DiceSemimetricLoss, per_voxel=False),
    "sdc": Case(L.SDCLoss, spatial=True),
    "ce_dml_boundary": Case(
        L.DiceSemimetricLoss, {"lambda_ce": 0.25, "lambda_dml": 0.75, "boundary_epsilon": 0.5}, per_voxel=False, spatial=True
    ),
}

MULTILABEL_CASES: dict[str, Case] = {
    "bce": Case(L.SigmoidBCELoss),
    "spa": Case(L.SPALoss),
}

LOSS_CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs" / "loss"
#: what a loss derives from, not a loss of its own (no config)
BASES = (SegmentationLoss, MultiLabelLoss, AugmentedLagrangianLoss)


def load_loss_config(name: str) -> DictConfig:
    """configs/loss/<name>.yaml with its defaults list (sibling loss configs, then ``_self_``) merged, as Hydra does."""
    cfg = OmegaConf.load(LOSS_CONFIGS / f"{name}.yaml")
    if "defaults" not in cfg:
        return cfg
    own = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "defaults"])
    parts = [own if entry == "_self_" else load_loss_config(entry) for entry in cfg.defaults]
    return OmegaConf.merge(*parts)


def loss_classes() -> set[type]:
    """Every loss class defined in a module of mcseg/losses (found by walking the package, bases left out)."""
    found = set()
    for info in pkgutil.iter_modules(L.__path__):
        module = importlib.import_module(f"{L.__name__}.{info.name}")
        found |= {obj for obj in vars(module).values() if inspect.isclass(obj) and obj.__module__ == module.__name__
                  and issubclass(obj, (SegmentationLoss, MultiLabelLoss)) and obj not in BASES}
    return found


# configs/loss/<name>.yaml -> the class of its ``_target_``: every file of the folder (a new loss is its module and
# its YAML; nothing here lists them)
CONFIG_CLASSES = {path.stem: hydra.utils.get_class(load_loss_config(path.stem)._target_)
                  for path in sorted(LOSS_CONFIGS.glob("*.yaml"))}

# presets: configs that extend another (a Hydra defaults list) and differ from the class defaults by these
# values (the mL1-ACE authors' combinations; hardl1ace_ce is at the class defaults)
_DICE_CE = {"lambda_ace": 0.33, "lambda_ce": 0.33, "lambda_dice": 0.33, "squared_pred": True, "smooth_nr": 0.0}
PRESETS = {
    "hardl1ace_dice": {"lambda_ce": 0.0, "lambda_dice": 0.5},
    "hardl1ace_dice_ce": _DICE_CE,
    "softl1ace_ce": {"binning": "soft"},
    "softl1ace_dice": {"binning": "soft", "lambda_ce": 0.0, "lambda_dice": 0.5},
    "softl1ace_dice_ce": {"binning": "soft", **_DICE_CE},
    "ce_dml": {"lambda_ce": 0.25, "lambda_dml": 0.75},  # the Dice-semimetric authors' combination
}


def random_inputs(shape, seed=0, dtype=torch.float32, scale=3.0, num_classes=None):
    """logits ``shape`` (B x C x spatial) and labels in [0, C)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    c = shape[1] if num_classes is None else num_classes
    target = torch.randint(0, c, (shape[0], *shape[2:]), generator=g)
    return logits, target

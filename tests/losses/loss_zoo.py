"""The softmax losses under test, with settings that make every term active on random logits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mcseg import losses as L

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
    "fcl": Case(L.FCLLoss),
    "fcl_adaptive": Case(L.FCLLoss, {"self_adaptive": True}),
    "brier": Case(L.BrierLoss),
}

MULTILABEL_CASES: dict[str, Case] = {
    "bce": Case(L.SigmoidBCELoss),
    "spa": Case(L.SPALoss),
}

# configs/loss/<name>.yaml -> class
CONFIG_CLASSES = {
    "ce": L.CELoss,
    "ce_dice": L.CEDiceLoss,
    "focal": L.FocalLoss,
    "flsd": L.FLSDLoss,
    "dual_focal": L.DualFocalLoss,
    "ecp": L.ECPLoss,
    "ls": L.LabelSmoothingLoss,
    "svls": L.SVLSLoss,
    "margin": L.MarginLoss,
    "margin_dice": L.MarginDiceLoss,
    "nacl": L.NACLLoss,
    "cals": L.CALSLoss,
    "fcl": L.FCLLoss,
    "brier": L.BrierLoss,
    "bce": L.SigmoidBCELoss,
    "spa": L.SPALoss,
}


def random_inputs(shape, seed=0, dtype=torch.float32, scale=3.0, num_classes=None):
    """logits ``shape`` (B x C x spatial) and labels in [0, C)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    c = shape[1] if num_classes is None else num_classes
    target = torch.randint(0, c, (shape[0], *shape[2:]), generator=g)
    return logits, target

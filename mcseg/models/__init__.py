"""Backbones: MONAI's networks are built straight from config; only what MONAI lacks lives here."""
from __future__ import annotations

import math

from torch import nn

from mcseg.models.mbls_unet import MbLSUNet2D

__all__ = ["MbLSUNet2D", "size_divisor"]


def size_divisor(model: nn.Module) -> int:
    """The factor every spatial input size must be a multiple of (the product of the strides)."""
    if hasattr(model, "size_divisor"):
        return int(model.size_divisor)
    from monai.networks.nets import DynUNet, UNet

    if isinstance(model, UNet):
        return math.prod(int(s) if not isinstance(s, (list, tuple)) else max(s) for s in model.strides)
    if isinstance(model, DynUNet):
        strides = [s if isinstance(s, (list, tuple)) else [s] for s in model.strides]
        return max(math.prod(int(s[d % len(s)]) for s in strides) for d in range(max(len(s) for s in strides)))
    return 1

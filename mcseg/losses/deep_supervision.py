"""Deep supervision: one loss over a network's final output and its auxiliary heads.

The weighting is nnU-Net's: head ``i`` (0 the final output, then the heads from the shallowest
to the deepest, :func:`mcseg.models.supervision_outputs`) weighs ``1 / 2**i``, the weights
normalised to sum to 1. A head smaller than the label sees the label downsampled (nearest
neighbour), as nnU-Net's targets are; MONAI's DynUNet and BasicUNetPlusPlus emit every head at
full resolution, so for them the label is used as it is.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn


def label_at(label: Tensor, size: Sequence[int]) -> Tensor:
    """``label`` (``B x *S`` class indices or ``B x C x *S`` multi-label targets) at spatial ``size``."""
    size = tuple(int(s) for s in size)
    if tuple(label.shape[-len(size):]) == size:
        return label
    channel = label.ndim == len(size) + 2
    resized = F.interpolate((label if channel else label[:, None]).float(), size=size, mode="nearest")
    return (resized if channel else resized[:, 0]).to(label.dtype)


def deep_supervision_loss(loss_fn: nn.Module, outputs: Sequence[Tensor], label: Tensor) -> Tensor:
    """``loss_fn`` over ``outputs`` (final first), weighted ``1 / 2**i`` and normalised; with a single
    output, simply ``loss_fn(output, label)``. Outputs are cast to float32 (autocast may give bf16)."""
    if len(outputs) == 1:
        return loss_fn(outputs[0].float(), label)
    weights = [0.5**i for i in range(len(outputs))]
    total = sum(weights)
    return sum(w / total * loss_fn(out.float(), label_at(label, out.shape[2:])) for w, out in zip(weights, outputs))

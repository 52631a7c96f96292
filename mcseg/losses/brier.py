"""Brier score as a loss."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import SegmentationLoss, one_hot

__all__ = ["BrierLoss", "brier_per_voxel"]


def brier_per_voxel(probs: Tensor, truth: Tensor) -> Tensor:
    """``sum_k (p_k - e_yk)^2`` over the class dim of ``B x C x spatial`` tensors -> ``B x spatial``."""
    return (probs - truth).square().sum(dim=1)


class BrierLoss(SegmentationLoss):
    """Brier score (Brier, 1950): ``sum_k (p_k - e_yk)^2`` per voxel, summed over the K
    classes (NOT divided by K), mean over non-ignored voxels. No hyperparameter.

    Soft targets q: ``sum_k (p_k - q_k)^2`` (against the rater mean this is NOT the mean of the raters'
    Brier scores, which adds the raters' disagreement ``sum_k q_k (1 - q_k)``: docs/losses.md).

    Args:
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    soft_targets = True

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        return self.reduce(brier_per_voxel(torch.softmax(logits, dim=1), q), None)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        probs = torch.softmax(logits, dim=1)
        return self.reduce(brier_per_voxel(probs, one_hot(target, logits.shape[1], logits.dtype)), valid)

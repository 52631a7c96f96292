"""Focal-loss family: focal, FLSD-53 (sample-dependent gamma), dual focal, focal calibration loss (FCL)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import SegmentationLoss, check_bool, check_float, one_hot
from .brier import brier_per_voxel

__all__ = ["DualFocalLoss", "FCLLoss", "FLSDLoss", "FocalLoss", "focal_per_voxel"]


def focal_per_voxel(base: Tensor, log_p_y: Tensor, gamma: float | Tensor) -> Tensor:
    """``-base^gamma * log p_y``; ``base`` is clamped to the smallest positive float so that
    ``0 < gamma < 1`` keeps a finite gradient when ``base`` is exactly 0 (p_y == 1)."""
    base = base.clamp(min=torch.finfo(base.dtype).tiny)
    return -base.pow(gamma) * log_p_y


def _log_p_y(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    log_probs = torch.log_softmax(logits, dim=1)
    return log_probs, log_probs.gather(1, target.unsqueeze(1)).squeeze(1)


class FocalLoss(SegmentationLoss):
    """Softmax focal loss (Lin et al., ICCV 2017; calibration: Mukhoti et al., NeurIPS 2020).

    ``-(1 - p_y)^gamma log p_y`` per voxel, MEAN over non-ignored voxels (several public
    versions sum instead). ``gamma = 0`` is CE.

    Args:
        gamma: focusing parameter >= 0; default 3 (the segmentation study; 1 and 2 also swept).
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(self, gamma: float = 3.0, ignore_index: int | None = None, reduction: str = "mean") -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma = check_float("gamma", gamma, low=0.0)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        _, log_p_y = _log_p_y(logits, target)
        return self.reduce(focal_per_voxel(-torch.expm1(log_p_y), log_p_y, self.gamma), valid)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, {super().extra_repr()}"


class FLSDLoss(SegmentationLoss):
    """FLSD-53: focal loss with a sample-dependent gamma (Mukhoti et al., NeurIPS 2020).

    ``gamma = gamma_low if p_y < threshold else gamma_high`` (5 below 0.2, else 3), chosen
    per voxel with ``torch.where`` (gamma is piecewise constant: no gradient through it).
    Mean over non-ignored voxels.

    Args:
        gamma_low: gamma for hard voxels (p_y < threshold); default 5.
        gamma_high: gamma for the others; default 3.
        threshold: p_y threshold in (0, 1]; default 0.2.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(
        self,
        gamma_low: float = 5.0,
        gamma_high: float = 3.0,
        threshold: float = 0.2,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma_low = check_float("gamma_low", gamma_low, low=0.0)
        self.gamma_high = check_float("gamma_high", gamma_high, low=0.0)
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0, low_open=True)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        _, log_p_y = _log_p_y(logits, target)
        hard = log_p_y.detach().exp() < self.threshold
        gamma = torch.where(hard, self.gamma_low, self.gamma_high).to(log_p_y.dtype)
        return self.reduce(focal_per_voxel(-torch.expm1(log_p_y), log_p_y, gamma), valid)

    def extra_repr(self) -> str:
        return (
            f"gamma_low={self.gamma_low}, gamma_high={self.gamma_high}, threshold={self.threshold}, "
            f"{super().extra_repr()}"
        )


class DualFocalLoss(SegmentationLoss):
    """Dual focal loss (Tao et al., ICML 2023).

    ``-(1 - p_y + p_j)^gamma log p_y`` per voxel, ``p_j`` the largest probability strictly
    below ``p_y`` (0 if none), as in the official code (gradient flows through p_j). MEAN
    over non-ignored voxels (the official code sums by default).

    Args:
        gamma: >= 0; default 5 (the paper's CIFAR / ResNet-50 setting; tuned per dataset).
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(self, gamma: float = 5.0, ignore_index: int | None = None, reduction: str = "mean") -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma = check_float("gamma", gamma, low=0.0)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs, log_p_y = _log_p_y(logits, target)
        probs = log_probs.exp()
        p_y = log_p_y.exp()
        below = probs < p_y.unsqueeze(1)
        p_j = torch.where(below, probs, torch.zeros_like(probs)).amax(dim=1)
        return self.reduce(focal_per_voxel(1.0 - p_y + p_j, log_p_y, self.gamma), valid)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, {super().extra_repr()}"


class FCLLoss(SegmentationLoss):
    """Focal calibration loss, FCL (Liang et al., arXiv 2410.18321, 2024):
    ``focal(gamma) + alpha * ||p - e_y||_2^2`` per voxel.

    The second term is the (squared) Brier score, summed over classes (not divided by K).
    With ``self_adaptive=True`` it is multiplied by the DETACHED ``(1 - p_y)^2``.
    Mean over non-ignored voxels. ``alpha = 0`` is the focal loss.

    Args:
        gamma: focal parameter >= 0; default 2.
        alpha: weight (lambda) of the Brier term >= 0; default 1.
        self_adaptive: weight the Brier term by ``(1 - p_y)^2`` (detached); default False.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(
        self,
        gamma: float = 2.0,
        alpha: float = 1.0,
        self_adaptive: bool = False,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma = check_float("gamma", gamma, low=0.0)
        self.alpha = check_float("alpha", alpha, low=0.0)
        self.self_adaptive = check_bool("self_adaptive", self_adaptive)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs, log_p_y = _log_p_y(logits, target)
        one_minus_p_y = -torch.expm1(log_p_y)
        brier = brier_per_voxel(log_probs.exp(), one_hot(target, logits.shape[1], logits.dtype))
        if self.self_adaptive:
            brier = brier * one_minus_p_y.detach().square()
        return self.reduce(focal_per_voxel(one_minus_p_y, log_p_y, self.gamma) + self.alpha * brier, valid)

    def extra_repr(self) -> str:
        return (
            f"gamma={self.gamma}, alpha={self.alpha}, self_adaptive={self.self_adaptive}, "
            f"{super().extra_repr()}"
        )

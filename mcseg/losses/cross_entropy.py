"""Cross-entropy and its direct regularised variants: CE, label smoothing (LS), confidence penalty (ECP)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import SegmentationLoss, check_bool, check_float

__all__ = ["CELoss", "ECPLoss", "LabelSmoothingLoss", "nll"]


def nll(log_probs: Tensor, target: Tensor) -> Tensor:
    """Per-voxel ``-log p_y`` (``B x spatial``) from ``B x C x spatial`` log-probabilities."""
    return -log_probs.gather(1, target.unsqueeze(1)).squeeze(1)


def soft_nll(log_probs: Tensor, q: Tensor) -> Tensor:
    """Per-voxel ``-sum_k q_k log p_k`` against ``B x C x spatial`` class probabilities ``q``."""
    return -(q * log_probs).sum(dim=1)


class CELoss(SegmentationLoss):
    """Cross-entropy ``-log p_y`` from ``log_softmax``, mean over non-ignored voxels.

    Input: logits ``B x C x spatial``, integer labels ``B x spatial``, or soft targets ``B x C x spatial``
    (class probabilities q: ``-sum_k q_k log p_k``; against the rater mean, the mean of the raters' CEs).

    Args:
        ignore_index: label excluded from the loss (default None).
        reduction: ``"mean"`` (default) or ``"sum"`` over non-ignored voxels.
    """

    soft_targets = True

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        return self.reduce(nll(torch.log_softmax(logits, dim=1), target), valid)

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        return self.reduce(soft_nll(torch.log_softmax(logits, dim=1), q), None)


class LabelSmoothingLoss(SegmentationLoss):
    """Label smoothing (Szegedy et al., CVPR 2016; Mueller et al., NeurIPS 2019).

    ``(1 - alpha) * (-log p_y) + alpha * mean_k(-log p_k)``, i.e. CE against the target
    ``(1 - alpha) e_y + alpha / K``; equal to ``F.cross_entropy(label_smoothing=alpha)``.
    Mean over non-ignored voxels.

    Soft targets q smooth the same way: CE against ``(1 - alpha) q + alpha / K``.

    Args:
        alpha: smoothing in [0, 1]; default 0.1 (segmentation studies; 0.05 in classification).
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    soft_targets = True

    def __init__(self, alpha: float = 0.1, ignore_index: int | None = None, reduction: str = "mean") -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.alpha = check_float("alpha", alpha, low=0.0, high=1.0)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        per_voxel = (1.0 - self.alpha) * nll(log_probs, target) - self.alpha * log_probs.mean(dim=1)
        return self.reduce(per_voxel, valid)

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        per_voxel = (1.0 - self.alpha) * soft_nll(log_probs, q) - self.alpha * log_probs.mean(dim=1)
        return self.reduce(per_voxel, None)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, {super().extra_repr()}"


class ECPLoss(SegmentationLoss):
    """CE with an entropy confidence penalty (Pereyra et al., ICLR workshop 2017).

    ``CE - alpha * H(p)`` per voxel, ``H(p) = -sum_k p_k log p_k``, computed from
    ``log_softmax`` (so no clamping of p is needed). With ``class_mean=True`` (default) the
    entropy term is averaged over voxels AND the K classes, as in the MbLS family of code
    (``ent.mean()``): the penalty is then ``(alpha / K) H(p)``, i.e. Pereyra's beta is
    ``alpha / K``. With ``class_mean=False`` it is Pereyra's ``beta * H(p)`` with beta = alpha.

    Args:
        alpha: penalty weight >= 0; default 0.1 (segmentation study, with ``class_mean=True``).
        class_mean: average the entropy over the classes too (default True, see above).
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(
        self,
        alpha: float = 0.1,
        class_mean: bool = True,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.alpha = check_float("alpha", alpha, low=0.0)
        self.class_mean = check_bool("class_mean", class_mean)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        neg_entropy = log_probs.exp() * log_probs  # p log p, -> 0 as p -> 0
        neg_entropy = neg_entropy.mean(dim=1) if self.class_mean else neg_entropy.sum(dim=1)
        return self.reduce(nll(log_probs, target) + self.alpha * neg_entropy, valid)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, class_mean={self.class_mean}, {super().extra_repr()}"

"""Batch-level confidence-accuracy penalties: DCA (top label) and MDCA (every class)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import SegmentationLoss, check_choice, check_float, masked_mean, one_hot
from .cross_entropy import nll
from .focal import focal_per_voxel

__all__ = ["DCALoss", "MDCALoss", "class_means"]


def class_means(values: Tensor, valid: Tensor | None) -> Tensor:
    """Mean of ``B x C x spatial`` values over the batch and the non-ignored voxels, per class (``C``; 0 if none)."""
    dims = (0, *range(2, values.ndim))
    if valid is None:
        return values.mean(dims)
    kept = torch.where(valid.unsqueeze(1), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum(dims) / valid.sum().clamp(min=1).to(values.dtype)


class MDCALoss(SegmentationLoss):
    """Multi-class difference in confidence and accuracy, MDCA (Hebbalaguppe et al., "A Stitch in
    Time Saves Nine: A Train-Time Regularizing Loss for Improved Neural Network Calibration",
    CVPR 2022).

    ``L_cls + beta * (1/K) sum_k |mean_v p_vk - mean_v 1[y_v = k]|``, every class (not only the
    top label), nothing detached. The means run over ALL non-ignored voxels of the BATCH (the
    official code is classification-only and averages over the mini-batch; pooling the batch's
    voxels is this extension's choice, not checked against the paper's segmentation setting), so
    the penalty is one number per batch, not a per-voxel loss.

    ``classification``: ``"ce"`` (the authors' NLL+MDCA); ``"focal"``: ``-(1 - p_y)^gamma log p_y``
    (FL+MDCA); ``"ls"``: CE against ``1 - alpha`` on the label and ``alpha / (K - 1)`` on every
    other class (LS+MDCA; NOTE: not the usual ``alpha / K`` of
    :class:`~mcseg.losses.LabelSmoothingLoss`). Each is the mean over non-ignored voxels.

    Defaults as the authors' scripts (``scripts/*.sh``): beta = 1, focal gamma = 1, LS alpha = 0.1.
    Their argument parser's default ``--beta 10`` (and ``--alpha 5``) is NOT what their scripts run.

    Args:
        beta: weight of the MDCA term >= 0; default 1.
        classification: ``"ce"`` (default), ``"focal"`` or ``"ls"``.
        gamma: focal parameter >= 0 (``"focal"`` only); default 1.
        alpha: smoothing in [0, 1] (``"ls"`` only); default 0.1.
        ignore_index: label excluded from both terms (default None).
        reduction: ``"mean"`` only.
    """

    reductions = ("mean",)

    def __init__(
        self,
        beta: float = 1.0,
        classification: str = "ce",
        gamma: float = 1.0,
        alpha: float = 0.1,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.beta = check_float("beta", beta, low=0.0)
        self.classification = check_choice("classification", classification, ("ce", "focal", "ls"))
        self.gamma = check_float("gamma", gamma, low=0.0)
        self.alpha = check_float("alpha", alpha, low=0.0, high=1.0)

    def classification_per_voxel(self, log_probs: Tensor, target: Tensor) -> Tensor:
        ce = nll(log_probs, target)
        if self.classification == "focal":
            return focal_per_voxel(-torch.expm1(-ce), -ce, self.gamma)
        if self.classification == "ls":
            others = -log_probs.sum(dim=1) - ce  # sum over k != y of -log p_k
            return (1.0 - self.alpha) * ce + self.alpha / (log_probs.shape[1] - 1) * others
        return ce

    def penalty(self, probs: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        """``(1/K) sum_k |mean p_k - frequency of k|`` over the batch's non-ignored voxels."""
        frequency = class_means(one_hot(target, probs.shape[1], probs.dtype), valid)
        return (class_means(probs, valid) - frequency).abs().mean()

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        data = masked_mean(self.classification_per_voxel(log_probs, target), valid)
        return data + self.beta * self.penalty(log_probs.exp(), target, valid)

    def extra_repr(self) -> str:
        return (
            f"beta={self.beta}, classification={self.classification!r}, gamma={self.gamma}, alpha={self.alpha}, "
            f"{super().extra_repr()}"
        )


class DCALoss(SegmentationLoss):
    """Difference between confidence and accuracy, DCA (Liang et al., "Improved Trainable
    Calibration Method for Neural Networks on Medical Imaging Classification", BMVC 2020).

    ``CE + beta * |mean_v max_k p_vk - mean_v 1[argmax_k p_vk = y_v]|``, the means over ALL
    non-ignored voxels of the BATCH (the official code averages over the mini-batch; one number
    per batch, not a per-voxel loss). The accuracy is piecewise constant, so the gradient flows
    through the mean top-label confidence only. Ties: the first maximum is the prediction.

    Defaults as the official code (FOURM-LAB/DCA ``cross_entropy_with_dca_loss``): CE weight 1,
    beta = 10. Other implementations differ: the MDCA authors' ``DCA`` runs beta = 1; netcal's
    ``DCAPenalty`` returns the unweighted penalty. Not provided: the official optional CE class
    weights (its demo's [0.735, 0.265]).

    Args:
        beta: weight of the DCA term >= 0; default 10.
        ignore_index: label excluded from both terms (default None).
        reduction: ``"mean"`` only.
    """

    reductions = ("mean",)

    def __init__(self, beta: float = 10.0, ignore_index: int | None = None, reduction: str = "mean") -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.beta = check_float("beta", beta, low=0.0)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        confidence, prediction = log_probs.exp().max(dim=1)
        accuracy = (prediction == target).to(confidence.dtype)
        gap = masked_mean(confidence, valid) - masked_mean(accuracy, valid)
        return masked_mean(nll(log_probs, target), valid) + self.beta * gap.abs()

    def extra_repr(self) -> str:
        return f"beta={self.beta}, {super().extra_repr()}"

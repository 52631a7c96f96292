"""Soft Dice term, CE + Dice, and the Dice semimetric loss (with boundary label smoothing)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import SegmentationLoss, check_bool, check_choice, check_float, check_int, masked_mean, one_hot
from .cross_entropy import nll

__all__ = ["CEDiceLoss", "DiceSemimetricLoss", "SoftDice", "boundary_voxels", "dice_semimetric"]


class SoftDice(nn.Module):
    """Soft Dice loss ``1 - (2 sum p g + smooth_nr) / (sum p + sum g + smooth_dr)``
    (``squared_pred=True``: ``sum p^2 + sum g^2`` in the denominator).

    Sums run over the spatial dims of each sample (``batch=False``, one Dice per sample and
    class) or over the batch too (``batch=True``); the result is the mean over samples and
    classes. Ignored voxels are removed from both p and the one-hot g. Same definition and
    defaults as MONAI's ``DiceLoss(softmax=True, to_onehot_y=True)``.

    Args:
        include_background: keep class 0 in the mean (default True, as MONAI, and as the
            margin-segmentation code's plain CE + Dice actually ran: its wrapper meant to drop it
            but did not; its margin + Dice does drop it, see :class:`~mcseg.losses.MarginDiceLoss`).
        batch: pool the sums over the batch before the ratio (default False).
        smooth_nr, smooth_dr: numerator / denominator smoothing (default 1e-5).
        squared_pred: square p and g in the denominator, as MONAI's ``squared_pred`` (default False).
    """

    def __init__(
        self,
        include_background: bool = True,
        batch: bool = False,
        smooth_nr: float = 1e-5,
        smooth_dr: float = 1e-5,
        squared_pred: bool = False,
    ) -> None:
        super().__init__()
        self.include_background = check_bool("include_background", include_background)
        self.batch = check_bool("batch", batch)
        self.smooth_nr = check_float("smooth_nr", smooth_nr, low=0.0)
        self.smooth_dr = check_float("smooth_dr", smooth_dr, low=0.0, low_open=True)
        self.squared_pred = check_bool("squared_pred", squared_pred)

    def forward(self, probs: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        """``probs`` ``B x C x spatial``; ``target`` ``B x spatial`` (ignored voxels hold any valid label)."""
        truth = one_hot(target, probs.shape[1], probs.dtype)
        if valid is not None:
            weight = valid.unsqueeze(1).to(probs.dtype)
            probs, truth = probs * weight, truth * weight
        if not self.include_background:
            probs, truth = probs[:, 1:], truth[:, 1:]
        dims = tuple(range(2, probs.ndim))
        if self.batch:
            dims = (0, *dims)
        intersection = (probs * truth).sum(dims)
        if self.squared_pred:
            denominator = probs.square().sum(dims) + truth.square().sum(dims)
        else:
            denominator = probs.sum(dims) + truth.sum(dims)
        return (1.0 - (2.0 * intersection + self.smooth_nr) / (denominator + self.smooth_dr)).mean()

    def extra_repr(self) -> str:
        return (
            f"include_background={self.include_background}, batch={self.batch}, "
            f"smooth_nr={self.smooth_nr}, smooth_dr={self.smooth_dr}, squared_pred={self.squared_pred}"
        )


class CEDiceLoss(SegmentationLoss):
    """``lambda_ce * CE + lambda_dice * soft Dice`` (1:1 by default).

    CE is the mean over non-ignored voxels; the Dice term is :class:`SoftDice` (mean over
    samples and classes, background included by default: set ``include_background=False``
    to exclude it). With no ignored voxels this equals MONAI's
    ``DiceCELoss(to_onehot_y=True, softmax=True)`` at the same settings.

    Args:
        lambda_ce, lambda_dice: weights (default 1.0 and 1.0).
        include_background, batch, smooth_nr, smooth_dr: see :class:`SoftDice`.
        ignore_index: label excluded from both terms (default None).
        reduction: ``"mean"`` only.
    """

    reductions = ("mean",)

    def __init__(
        self,
        lambda_ce: float = 1.0,
        lambda_dice: float = 1.0,
        include_background: bool = True,
        batch: bool = False,
        smooth_nr: float = 1e-5,
        smooth_dr: float = 1e-5,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.lambda_ce = check_float("lambda_ce", lambda_ce, low=0.0)
        self.lambda_dice = check_float("lambda_dice", lambda_dice, low=0.0)
        self.dice = SoftDice(include_background, batch, smooth_nr, smooth_dr)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        ce = masked_mean(nll(log_probs, target), valid)
        return self.lambda_ce * ce + self.lambda_dice * self.dice(log_probs.exp(), target, valid)

    def extra_repr(self) -> str:
        return f"lambda_ce={self.lambda_ce}, lambda_dice={self.lambda_dice}, {super().extra_repr()}"


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def boundary_voxels(target: Tensor, num_classes: int, kernel: int, valid: Tensor | None = None) -> Tensor:
    """``B x spatial`` bool: voxels whose ``kernel^d`` window (clipped at the image border) holds
    another label, leaving out every voxel with an ignored voxel (``~valid``) in its window, as
    the Dice-semimetric authors' ``get_label_boundary`` (one-hot differs from its min-pool)."""
    pool = _MAX_POOL[target.ndim - 1]
    truth = one_hot(target, num_classes, torch.float32)
    if valid is not None:
        truth = truth * valid.unsqueeze(1)
    eroded = -pool(-truth, kernel_size=kernel, stride=1, padding=kernel // 2)
    boundary = (truth != eroded).any(dim=1)
    if valid is not None:
        near_ignored = pool((~valid).unsqueeze(1).float(), kernel_size=kernel, stride=1, padding=kernel // 2)[:, 0] > 0
        boundary = boundary & ~near_ignored
    return boundary


def dice_semimetric(
    probs: Tensor, labels: Tensor, smooth: float, active: str = "present", threshold: float = 0.01,
    valid: Tensor | None = None,
) -> Tensor:
    """Dice semimetric loss of ``B x C x spatial`` probabilities against (soft) labels of the same shape:
    per class ``c``, with L1 norms over the batch and voxels, ``||p_c - y_c|| / (||p_c|| + ||y_c|| + 2 smooth)``,
    then the mean over the active classes (``"present"``: ``max y_c > threshold``; ``"all"``); 0 (with a
    gradient graph) if none is active. ``valid`` (``B x spatial``) zeroes ignored voxels in p and y."""
    if valid is not None:
        weight = valid.unsqueeze(1).to(probs.dtype)
        probs, labels = probs * weight, labels * weight
    dims = (0, *range(2, probs.ndim))
    distance = (probs - labels).abs().sum(dims)
    per_class = distance / (probs.sum(dims) + labels.sum(dims) + 2.0 * smooth)
    if active == "all":
        return per_class.mean()
    # a masked mean, without reading the mask back (a training step never synchronises with the host)
    present = (labels.amax(dims) > threshold).to(per_class.dtype)
    count = present.sum()
    return (per_class * present).sum() / count.clamp_min(1.0)


class DiceSemimetricLoss(SegmentationLoss):
    """Dice semimetric loss, DML (Wang & Blaschko, "Dice Semimetric Losses: Optimizing the Dice
    Score with Soft Labels", MICCAI 2023; code zifuwanggg/JDTLosses, ``losses/jdt_loss.py``),
    optionally with boundary label smoothing and a CE (KL) term.

    ``lambda_dml * DML + lambda_ce * KL(q || p)`` with, per class c and L1 norms over the WHOLE
    batch and all voxels (the authors' default ``mIoUD``: tp, fp, fn summed over the batch,
    dataset-style),

    ``DML_c = ||p_c - q_c||_1 / (||p_c||_1 + ||q_c||_1 + 2 smooth)``

    (the authors' Tversky form ``1 - (tp + s) / (tp + fp/2 + fn/2 + s)`` with
    ``tp = (|p| + |q| - ||p - q||) / 2``, in closed form), then the mean over the active classes.
    With hard labels it equals soft Dice (``batch=True``, smoothing ``2 smooth`` above and
    below); unlike soft Dice it stays a proper loss with soft labels: 0 exactly at ``p = q``.

    ``q`` is the one-hot label, or with ``boundary_epsilon > 0`` the authors' boundary label
    smoothing (their ``ls.yaml``: epsilon 0.5, k 3): only voxels whose ``k^d`` window holds
    another label (and no ignored voxel) get ``(1 - eps) e_y + eps / C``; the others stay hard.
    The authors' code is 2D (``max_pool2d``); here the window is ``k x k`` in 2D, ``k x k x k``
    in 3D.

    The CE term is ``sum_k q_k (log q_k - log p_k)``, the mean over non-ignored voxels: the
    authors' CE with hard labels and their ``KLDivLoss(T=1)`` with soft labels (the same
    gradient as soft CE). The authors' preset (``dice_*_present_all.yaml``) is
    ``0.25 CE + 0.75 DML`` (``configs/loss/ce_dml.yaml``); their CE is also averaged with an
    auxiliary head's (``0.5 main + 0.5 aux``), which mcseg's networks do not have, so the CE
    here is the main output's.

    Active classes (``active_classes="auto"``, the authors' behaviour): hard labels ->
    ``"present"`` (``max_{batch, voxels} q_c > threshold``, so classes absent from the batch
    are left out, background included when present); soft labels (``boundary_epsilon > 0``) ->
    ``"all"``. If no class is active the DML term is 0. Probabilities from
    ``log_softmax(z).exp()``; ignored voxels are zeroed in p and q (the authors' ``keep_mask``).
    Not provided: the authors' ``gamma`` power, ``log_loss``, class weights and the per-image
    ``mIoUI`` / ``mIoUC`` modes (all off in their configs). Soft targets (the rater mean,
    ``dataset.raters.target=mean``) are taken as q directly, without boundary smoothing.

    Args:
        lambda_dml: weight of DML >= 0; default 1.
        lambda_ce: weight of the CE / KL term >= 0; default 0 (the preset: 0.25 with 0.75 DML).
        smooth: s >= 0; default 1 (the authors' configs; their class default is 1e-3).
        threshold: presence threshold in [0, 1); default 0.01.
        active_classes: ``"auto"`` (default), ``"present"`` or ``"all"``.
        boundary_epsilon: eps in [0, 1] of the boundary label smoothing; default 0 (off).
        boundary_kernel: odd window size k >= 1; default 3.
        ignore_index: label excluded from both terms (default None).
        reduction: ``"mean"`` only.
    """

    reductions = ("mean",)
    soft_targets = True

    def __init__(
        self,
        lambda_dml: float = 1.0,
        lambda_ce: float = 0.0,
        smooth: float = 1.0,
        threshold: float = 0.01,
        active_classes: str = "auto",
        boundary_epsilon: float = 0.0,
        boundary_kernel: int = 3,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.lambda_dml = check_float("lambda_dml", lambda_dml, low=0.0)
        self.lambda_ce = check_float("lambda_ce", lambda_ce, low=0.0)
        self.smooth = check_float("smooth", smooth, low=0.0)
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0, high_open=True)
        self.active_classes = check_choice("active_classes", active_classes, ("auto", "present", "all"))
        self.boundary_epsilon = check_float("boundary_epsilon", boundary_epsilon, low=0.0, high=1.0)
        self.boundary_kernel = check_int("boundary_kernel", boundary_kernel, low=1, odd=True)

    def soft_labels(self, target: Tensor, num_classes: int, valid: Tensor | None, dtype: torch.dtype) -> Tensor:
        """``B x C x spatial`` labels q: one-hot, boundary voxels smoothed when ``boundary_epsilon > 0``."""
        truth = one_hot(target, num_classes, dtype)
        if self.boundary_epsilon == 0.0:
            return truth
        boundary = boundary_voxels(target, num_classes, self.boundary_kernel, valid).unsqueeze(1)
        smoothed = (1.0 - self.boundary_epsilon) * truth + self.boundary_epsilon / num_classes
        return torch.where(boundary, smoothed, truth)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        labels = self.soft_labels(target, logits.shape[1], valid, logits.dtype)
        active = self.active_classes
        if active == "auto":
            active = "all" if self.boundary_epsilon > 0 else "present"
        total = self.lambda_dml * dice_semimetric(log_probs.exp(), labels, self.smooth, active, self.threshold, valid)
        if self.lambda_ce > 0:
            kl = (torch.xlogy(labels, labels) - labels * log_probs).sum(dim=1)
            total = total + self.lambda_ce * masked_mean(kl, valid)
        return total

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        """DML (and KL) against soft targets q used as they are (the boundary smoothing is for hard labels);
        ``active_classes="auto"`` takes every class, as the authors do for soft labels."""
        log_probs = torch.log_softmax(logits, dim=1)
        active = "all" if self.active_classes == "auto" else self.active_classes
        total = self.lambda_dml * dice_semimetric(log_probs.exp(), q, self.smooth, active, self.threshold, None)
        if self.lambda_ce > 0:
            total = total + self.lambda_ce * masked_mean((torch.xlogy(q, q) - q * log_probs).sum(dim=1), None)
        return total

    def extra_repr(self) -> str:
        return (
            f"lambda_dml={self.lambda_dml}, lambda_ce={self.lambda_ce}, smooth={self.smooth}, "
            f"threshold={self.threshold}, active_classes={self.active_classes!r}, "
            f"boundary_epsilon={self.boundary_epsilon}, boundary_kernel={self.boundary_kernel}, {super().extra_repr()}"
        )

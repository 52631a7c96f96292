"""Marginal L1 average calibration error (mL1-ACE), hard- and soft-binned, alone or with CE and Dice."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import SegmentationLoss, check_bool, check_choice, check_float, check_int, masked_mean, one_hot
from .cross_entropy import nll, soft_nll
from .dice import SoftDice

__all__ = ["L1ACELoss", "binned_calibration", "l1_ace"]

#: the authors' edges run from 0 to 1 + float32 eps (so that p = 1 falls in the last bin)
_EDGE_END = 1.0 + torch.finfo(torch.float32).eps


def _edges(num_points: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``linspace(0, 1 + eps_f32, num_points)`` computed in float32 as the authors' code, then cast."""
    return torch.linspace(0.0, _EDGE_END, num_points, dtype=torch.float32, device=device).to(dtype)


def binned_calibration(
    probs: Tensor, truth: Tensor, valid: Tensor | None, num_bins: int, binning: str, empty_weight: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per image, class and bin: mean probability, mean one-hot truth and bin weight, each ``B x C x K``.

    ``probs`` and ``truth`` are ``B x C x S`` (S flattened voxels), ``valid`` ``B x S`` or None.
    Every (image, class, bin) has its own slot ``(b C + c) K + k``; all voxels are added into
    their slots by one ``index_add_`` (sum of weights, of weight x p and of weight x truth).

    * ``"hard"``: bins ``(lo, hi]`` over the authors' edges (``bucketize(right=False)``; 0 goes to
      bin 0), weight 1. A bin with no voxel is empty.
    * ``"soft"``: each voxel splits weight 1 between its two nearest bin centres
      ``(k + 1/2)(1 + eps_f32)/K`` by linear interpolation; below the first and above the last
      centre it all goes to the end bin. The weights carry the gradient (into both means). A
      bin whose weight is below ``empty_weight`` is empty.

    Means of empty bins are NaN.
    """
    b, c, s = probs.shape
    dtype, device = probs.dtype, probs.device
    slot = (torch.arange(b * c, device=device) * num_bins).view(b, c, 1)
    keep = None if valid is None else valid.unsqueeze(1).expand(b, c, s)
    if binning == "hard":
        index = torch.bucketize(probs.detach().contiguous(), _edges(num_bins + 1, dtype, device)[1:], right=False)
        index = (index.clamp(max=num_bins - 1) + slot).reshape(-1)
        weight = torch.ones_like(probs)
        if keep is not None:
            weight = keep.to(dtype)
        rows = torch.stack([weight, weight * probs, weight * truth]).reshape(3, -1)
    else:
        centres = _edges(2 * num_bins + 1, dtype, device)[1::2].contiguous()
        left = (torch.bucketize(probs.detach().contiguous(), centres, right=False) - 1).clamp(0, num_bins - 2)
        lo, hi = centres[left], centres[left + 1]
        w_right = ((probs - lo) / (hi - lo)).clamp(0.0, 1.0)
        w_left = 1.0 - w_right
        if keep is not None:
            zero = torch.zeros((), dtype=dtype, device=device)
            w_left, w_right = torch.where(keep, w_left, zero), torch.where(keep, w_right, zero)
        weight = torch.stack([w_left, w_right])
        index = torch.stack([left, left + 1]).add_(slot).reshape(-1)
        rows = torch.stack([weight, weight * probs, weight * truth]).reshape(3, -1)
    sums = torch.zeros(3, b * c * num_bins, dtype=dtype, device=device).index_add_(1, index, rows)
    sums = sums.view(3, b, c, num_bins)
    count = sums[0]
    empty = count == 0 if binning == "hard" else count < empty_weight
    nan = torch.full((), torch.nan, dtype=dtype, device=device)
    safe = torch.where(empty, torch.ones((), dtype=dtype, device=device), count)  # no 0/0 in the backward pass
    return torch.where(empty, nan, sums[1] / safe), torch.where(empty, nan, sums[2] / safe), count


def l1_ace(mean_p: Tensor, mean_y: Tensor) -> Tensor:
    """``nanmean_k |mean_p - mean_y|`` over the bins (last dim): ``B x C``; 0 where every bin is empty."""
    filled = ~(mean_p.isnan() | mean_y.isnan())
    zero = torch.zeros((), dtype=mean_p.dtype, device=mean_p.device)
    gap = torch.where(filled, mean_p - mean_y, zero).abs()  # NaN-free, also in the backward pass
    return gap.sum(-1) / filled.sum(-1).clamp(min=1).to(gap.dtype)


class L1ACELoss(SegmentationLoss):
    """Marginal L1 average calibration error, mL1-ACE (Barfoot et al., "Average Calibration Error:
    A Differentiable Loss for Improved Reliability in Image Segmentation", MICCAI 2024; journal
    version arXiv 2506.03942), hard- or soft-binned, optionally with CE and soft Dice.

    ``lambda_ace * ACE + lambda_ce * CE + lambda_dice * Dice`` with, per image b and class c
    (every class channel of every voxel enters its class's diagram: marginal, not top-label),
    ``f_bc = nanmean_k |mean_{v in B_k} p_v - mean_{v in B_k} 1[y_v = c]|`` over the NON-EMPTY bins
    (the unweighted mean over bins: ACE, not ECE), and ``ACE = mean_{b, c} f_bc``.

    * ``binning="hard"``: K equal bins ``(lo, hi]`` on the authors' edges ``linspace(0, 1 + eps_f32,
      K + 1)`` (their docstring says ``[lo, hi)``; ``torch.bucketize(right=False)`` makes them
      ``(lo, hi]``, which matters only for values exactly on an edge). The gradient flows through
      the bin means of p only (the assignment is piecewise constant):
      ``d f / d p_v = sign(mean_p_k - mean_y_k) / (K_non-empty n_k)``.
    * ``binning="soft"``: each voxel splits weight 1 between its two nearest bin centres
      ``(k + 1/2)/K`` by linear interpolation (the whole weight to the end bin below the first /
      above the last centre; the authors' +-10000 sentinels give the same weights to float
      rounding); weighted means of p and of the truth, so the gradient flows through the weights
      into both. Bins with total weight < ``empty_weight`` are empty.

    Empty classes (no voxel of class c in image b): ``empty_classes="zero"`` (default, the authors'
    ``ignore_empty_classes=True``): f_bc is set to 0 but STILL COUNTED in the mean over (b, c),
    so empty classes dilute the loss; ``"exclude"``: dropped from the mean (0 if none is left);
    ``"keep"``: their f_bc counts as computed (the authors' ``ignore_empty_classes=False``).

    CE: mean over non-ignored voxels (the authors' ``nn.CrossEntropyLoss`` on one-hot targets).
    Dice: :class:`~mcseg.losses.dice.SoftDice` (per sample and class, MONAI's ``DiceLoss``).
    ``include_background`` applies to ACE and Dice, as in every official config (both True).
    Ignored voxels are left out of the bins, the class-presence test, CE and Dice. Vectorised
    over images, classes and bins (one ``index_add_``; the authors loop over B and C). Same
    code in 2D and 3D: the bins pool all voxels of an image, whatever its dimension.

    The authors' presets (``configs/loss/{hard,soft}l1ace_{ce,dice,dice_ce}.yaml``): 0.5 ACE +
    0.5 CE (the class defaults); 0.5 ACE + 0.5 Dice (MONAI Dice defaults); 0.33 ACE + 0.33 Dice
    + 0.33 CE with ``squared_pred=True, smooth_nr=0, smooth_dr=1e-5``. Not provided: the
    authors' per-class ``weight`` (unused in their configs).

    Args:
        binning: ``"hard"`` (default) or ``"soft"``.
        num_bins: K >= 2; default 20.
        lambda_ace, lambda_ce, lambda_dice: weights; default 0.5, 0.5, 0 (``HardL1ACEandCELoss``).
        empty_classes: ``"zero"`` (default), ``"exclude"`` or ``"keep"``, see above.
        include_background: keep class 0 in ACE and Dice; default True.
        empty_weight: soft-binning emptiness threshold > 0; default 0.01 (the authors').
        squared_pred, smooth_nr, smooth_dr: of the Dice term (see :class:`SoftDice`); default
            False, 1e-5, 1e-5.
        ignore_index: label excluded from every term (default None).
        reduction: ``"mean"`` only.
    """

    reductions = ("mean",)

    def __init__(
        self,
        binning: str = "hard",
        num_bins: int = 20,
        lambda_ace: float = 0.5,
        lambda_ce: float = 0.5,
        lambda_dice: float = 0.0,
        empty_classes: str = "zero",
        include_background: bool = True,
        empty_weight: float = 0.01,
        squared_pred: bool = False,
        smooth_nr: float = 1e-5,
        smooth_dr: float = 1e-5,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.binning = check_choice("binning", binning, ("hard", "soft"))
        self.num_bins = check_int("num_bins", num_bins, low=2)
        self.lambda_ace = check_float("lambda_ace", lambda_ace, low=0.0)
        self.lambda_ce = check_float("lambda_ce", lambda_ce, low=0.0)
        self.lambda_dice = check_float("lambda_dice", lambda_dice, low=0.0)
        self.empty_classes = check_choice("empty_classes", empty_classes, ("zero", "exclude", "keep"))
        self.include_background = check_bool("include_background", include_background)
        self.empty_weight = check_float("empty_weight", empty_weight, low=0.0, low_open=True)
        self.dice = SoftDice(include_background, False, smooth_nr, smooth_dr, squared_pred)

    @property
    def soft_targets(self) -> bool:
        """Soft targets (the rater mean) are taken by ACE and CE; the soft Dice term needs hard labels."""
        return self.lambda_dice == 0

    hard_label_reason = " with lambda_dice > 0 (its soft Dice term)"

    def ace(self, probs: Tensor, truth: Tensor, valid: Tensor | None) -> Tensor:
        """The mL1-ACE term alone from ``B x C x spatial`` probabilities and one-hot (or soft) targets ``truth``:
        a bin's observed frequency is the mean of ``truth`` over its voxels."""
        b, c = probs.shape[:2]
        if not self.include_background:
            probs, truth = probs[:, 1:], truth[:, 1:]
        probs, truth = probs.reshape(b, probs.shape[1], -1), truth.reshape(b, truth.shape[1], -1)
        flat_valid = None if valid is None else valid.reshape(b, -1)
        mean_p, mean_y, _ = binned_calibration(probs, truth, flat_valid, self.num_bins, self.binning,
                                               self.empty_weight)
        f = l1_ace(mean_p, mean_y)
        if self.empty_classes == "keep":
            return f.mean()
        kept_truth = truth if flat_valid is None else truth * flat_valid.unsqueeze(1).to(truth.dtype)
        present = kept_truth.sum(-1) > 0
        f = torch.where(present, f, torch.zeros((), dtype=f.dtype, device=f.device))
        if self.empty_classes == "zero":
            return f.mean()
        return f.sum() / present.sum().clamp(min=1).to(f.dtype)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        probs = log_probs.exp()
        total = self.lambda_ace * self.ace(probs, one_hot(target, logits.shape[1], probs.dtype), valid)
        if self.lambda_ce:
            total = total + self.lambda_ce * masked_mean(nll(log_probs, target), valid)
        if self.lambda_dice:
            total = total + self.lambda_dice * self.dice(probs, target, valid)
        return total

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        total = self.lambda_ace * self.ace(log_probs.exp(), q, None)
        if self.lambda_ce:
            total = total + self.lambda_ce * masked_mean(soft_nll(log_probs, q), None)
        return total

    def extra_repr(self) -> str:
        return (
            f"binning={self.binning!r}, num_bins={self.num_bins}, lambda_ace={self.lambda_ace}, "
            f"lambda_ce={self.lambda_ce}, lambda_dice={self.lambda_dice}, empty_classes={self.empty_classes!r}, "
            f"include_background={self.include_background}, empty_weight={self.empty_weight}, "
            f"{super().extra_repr()}"
        )

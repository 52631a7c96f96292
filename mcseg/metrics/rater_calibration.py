"""Calibration against several raters: against their soft mean, and per rater as CURVAS computes it.

Two different quantities (../shared/reference/multirater_and_interop.md, Part A), named apart:

* **Against the rater mean** (:func:`soft_calibration`): a voxel's observed frequency of class c is m_c, the
  fraction of raters that gave c. With p the probabilities, r = max_c p_c and yhat = argmax_c p_c (first
  maximum), equal-width bins (lo, hi] as mcseg's other ECEs (:mod:`mcseg.metrics.binning`):
  ECE_soft = sum_b |B_b|/N |mean_{B_b} m_yhat - mean_{B_b} r| (the reliability of "mean p against the mean
  soft label per bin", its bins :attr:`SoftCalibration.top`); classwise ECE_soft = (1/C) sum_c ECE_c, bins over p_c, observed m_c;
  NLL_soft = -(1/N) sum_v sum_c m_c log max(p_c, 1e-12), which equals the mean over raters of each rater's
  NLL (NLL is linear in the target); Brier_soft = (1/N) sum_v sum_c (p_c - m_c)^2, which is NOT the mean of the
  raters' Briers (that adds the raters' variance (1/N) sum_v sum_c m_c (1 - m_c)). With one rater every figure
  is mcseg's usual one. The sums add, so pooled values over cases come from the same pass.
* **Against each rater** (:func:`rater_reliability`): the same top-label bins over r with observed frequency
  1[y_k = yhat] for rater k, one row per rater: mcseg's single-label top-label reliability bins
  (:func:`mcseg.metrics.binning.bin_sums`) with that rater's map as the label. Beside
  :attr:`SoftCalibration.top` they give the reliability diagrams against the rater mean and against one rater.
* **Per rater, as CURVAS** (:func:`curvas_ece`): one top-label ECE per rater against that rater's labels, as
  torchmetrics' ``MulticlassCalibrationError(n_bins=50, norm="l1")`` bins: [lo, hi), a confidence of exactly
  1 in an extra bin of its own. The probabilities are rebuilt from the submitted foreground channels as the
  code does: 2024 [1 - sum_c p_c, p_1, ...] (if any entry leaves [0, 1], torchmetrics softmaxes every voxel's
  row: reproduced); 2025 [1 - p, p] clamped to >= 1e-8 and renormalised. The voxels are the edition's crop:
  :func:`curvas2024_crop` (in-plane box of image > 0, every slice), :func:`curvas2025_crop` (the box of every
  rater's foreground widened by 20 voxels per side, sliced as Python does: not clamped, a negative start
  wraps around).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mcseg.metrics.binning import BinSums, bin_index, bin_sums
from mcseg.metrics.calibration import NLL_FLOOR, top_label
from mcseg.metrics.raters import check_raters, rater_mean

__all__ = ["SoftCalibration", "soft_calibration", "rater_reliability", "curvas_ece", "curvas2024_crop",
           "curvas2025_crop", "CURVAS_BINS"]

CURVAS_BINS = 50


def _weighted_bins(bins: torch.Tensor, conf: torch.Tensor, observed: torch.Tensor, n_bins: int) -> BinSums:
    """Per-bin count, sum of confidence and sum of observed frequency (float64)."""
    count = torch.bincount(bins, minlength=n_bins).double()
    return BinSums(count, torch.bincount(bins, weights=conf.double(), minlength=n_bins),
                   torch.bincount(bins, weights=observed.double(), minlength=n_bins))


@dataclass(frozen=True)
class SoftCalibration:
    """Additive statistics of calibration against the rater mean (module docstring)."""

    top: BinSums  # (M,)
    classwise: BinSums  # (C, M)
    nll_sum: torch.Tensor
    brier_sum: torch.Tensor

    def __add__(self, other: SoftCalibration) -> SoftCalibration:
        return SoftCalibration(self.top + other.top, self.classwise + other.classwise,
                               self.nll_sum + other.nll_sum, self.brier_sum + other.brier_sum)

    def values(self) -> dict[str, float]:
        n = float(self.top.count.sum())
        return {"ece_mean": float(self.top.ece()), "classwise_ece_mean": float(self.classwise.ece().mean()),
                "nll_mean": float(self.nll_sum) / n if n else math.nan,
                "brier_mean": float(self.brier_sum) / n if n else math.nan, "n_voxels": int(n)}


def _voxels(probs: torch.Tensor, raters: torch.Tensor,
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``C x N`` probabilities (fp16/bf16 in fp32) and ``K x N`` rater labels of the voxels in ``mask``
    (or every voxel), after checking that the raters fit the probabilities."""
    num_classes = probs.shape[0]
    check_raters(raters, num_classes, probs.shape[1:])
    p = probs.reshape(num_classes, -1)
    p = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
    y = raters.reshape(raters.shape[0], -1).to(p.device)
    if mask is not None:
        keep = mask.reshape(-1).to(p.device)
        p, y = p[:, keep], y[:, keep]
    return p, y


def soft_calibration(probs: torch.Tensor, raters: torch.Tensor, n_bins: int = 15,
                     mask: torch.Tensor | None = None) -> SoftCalibration:
    """Calibration of ``C x *S`` probabilities against the mean of ``K x *S`` raters over ``mask`` (or all)."""
    num_classes = probs.shape[0]
    p, y = _voxels(probs, raters, mask)
    m = rater_mean(y, num_classes, p.dtype)
    conf, pred = top_label(p)
    top = _weighted_bins(bin_index(conf, n_bins), conf, m.gather(0, pred.long()[None])[0], n_bins)
    classwise = BinSums.stack([_weighted_bins(bin_index(p[c], n_bins), p[c], m[c], n_bins)
                               for c in range(num_classes)])
    pd, md = p.double(), m.double()
    nll = -(md * pd.clamp_min(NLL_FLOOR).log()).sum()
    brier = ((pd - md) ** 2).sum()
    return SoftCalibration(top, classwise, nll, brier)


def rater_reliability(probs: torch.Tensor, raters: torch.Tensor, n_bins: int = 15,
                      mask: torch.Tensor | None = None) -> BinSums:
    """Top-label reliability bins (K, M) of ``C x *S`` probabilities against each of ``K x *S`` raters over
    ``mask`` (or all): row k bins r = max_c p_c into the M bins (lo, hi] with observed frequency 1[y_k = yhat],
    i.e. sum_{v in B_b} 1, sum_{v in B_b} r and sum_{v in B_b} 1[y_k(v) = yhat(v)], as the single-label
    top-label bins of rater k's map as the label."""
    p, y = _voxels(probs, raters, mask)
    conf, pred = top_label(p)
    bins = bin_index(conf, n_bins)
    return BinSums.stack([bin_sums(bins, conf, rater == pred, n_bins) for rater in y])


def curvas2024_crop(image: torch.Tensor, slice_axis: int = -1) -> tuple[slice, ...]:
    """CURVAS 2024's voxels: the box of ``image > 0`` (HU) in the plane, every slice along ``slice_axis``."""
    fg = image > 0
    axis = slice_axis % fg.ndim
    out = []
    for a in range(fg.ndim):
        if a == axis or not bool(fg.any()):
            out.append(slice(None))
            continue
        hits = torch.nonzero(fg.any(dim=tuple(d for d in range(fg.ndim) if d != a))).flatten()
        out.append(slice(int(hits[0]), int(hits[-1]) + 1))
    return tuple(out)


def curvas2025_crop(raters: torch.Tensor, margin: int = 20) -> tuple[slice, ...]:
    """CURVAS 2025's voxels: per axis ``(min - margin):(max + margin)`` of every rater's foreground, as Python
    slices (not clamped: a negative start counts from the end). Raises when every rater's map is empty."""
    fg = (raters > 0).any(0)
    if not bool(fg.any()):
        raise ValueError("curvas2025_crop: every rater's map is empty (the CURVAS 2025 code fails here too)")
    out = []
    for a in range(fg.ndim):
        hits = torch.nonzero(fg.any(dim=tuple(d for d in range(fg.ndim) if d != a))).flatten()
        out.append(slice(int(hits[0]) - margin, int(hits[-1]) + margin))
    return tuple(out)


def _torchmetrics_top_label_ece(probs: torch.Tensor, target: torch.Tensor, n_bins: int) -> float:
    """Top-label L1 ECE of ``C x N`` probabilities binned as torchmetrics does: [lo, hi), 1.0 in bin n_bins."""
    conf, pred = probs.max(0)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=conf.dtype, device=conf.device)
    bins = torch.bucketize(conf, edges, right=True) - 1
    sums = _weighted_bins(bins, conf, (pred == target).to(conf.dtype), n_bins + 1)
    return float(sums.ece())


def curvas_ece(probs: torch.Tensor, raters: torch.Tensor, edition: int = 2024, n_bins: int = CURVAS_BINS,
               crop: Sequence[slice] | None = None) -> dict[str, float | list[float]]:
    """One ECE per rater as the CURVAS code computes it, and their mean (module docstring).

    Args:
        probs: ``C x *S`` probabilities; only the foreground channels 1.. are used (CURVAS is not given
            channel 0).
        raters: ``K x *S`` label maps.
        edition: 2024 (several organs) or 2025 (binary).
        crop: the voxel box (:func:`curvas2024_crop`, :func:`curvas2025_crop`), or every voxel.
    """
    if edition not in (2024, 2025):
        raise ValueError(f"edition={edition}: expected 2024 or 2025")
    num_classes = probs.shape[0]
    check_raters(raters, num_classes, probs.shape[1:])
    if edition == 2025 and num_classes != 2:
        raise ValueError(f"CURVAS 2025's ECE is binary; got {num_classes} classes")
    box = (slice(None),) + tuple(crop) if crop is not None else (slice(None),)
    fg = probs[box][1:].reshape(num_classes - 1, -1).double()
    y = raters[box].reshape(raters.shape[0], -1)
    if edition == 2024:
        p = torch.cat([1.0 - fg.sum(0, keepdim=True), fg])
        if bool((p < 0).any()) or bool((p > 1).any()):  # torchmetrics' check of the whole tensor
            p = p.softmax(0)
    else:
        p = torch.cat([1.0 - fg, fg]).clamp_min(1e-8)
        p = p / p.sum(0, keepdim=True)
    per_rater = [_torchmetrics_top_label_ece(p, y[r], n_bins) for r in range(y.shape[0])]
    return {"ece_per_rater": per_rater, "ece_rater_mean": float(sum(per_rater) / len(per_rater))}

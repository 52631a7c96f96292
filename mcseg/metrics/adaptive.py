"""Adaptive (equal-mass) top-label ECE: AdaECE of Mukhoti et al. (NeurIPS 2020), also called
ECE_EM (Roelofs et al., AISTATS 2022). Not Nixon et al.'s adaptive *classwise* ACE, and not
the unweighted mean over bins that netcal and MONAI ("average") call ACE.

Definition (per case, exact). Sort the N top-label confidences r_(1) <= ... <= r_(N); the
thresholds are the order statistics t_b = r_(ceil(b N / M)), b = 1..M-1, with t_0 = -inf and
t_M = +inf; bin b holds the voxels with t_{b-1} < r <= t_b, and

    AdaECE = sum_b |B_b|/N |acc(B_b) - conf(B_b)|.

Without ties every bin holds floor(N/M) or ceil(N/M) voxels (the split of ``np.array_split``
up to which bins get the extra voxel); tied confidences always share a bin, so the value does
not depend on an arbitrary order of ties (bins between repeated thresholds are empty).

Streaming. Each case also fills a fine histogram of (count, sum of confidence, number correct)
over 26,625 buckets log-spaced in 1 - r (1024 per octave, i.e. 0.068% relative width, from
1 - r = 2^-26 to 1; anything closer to 1 shares the top bucket, which for float32 confidences
holds exactly the value 1.0; 640 kB per accumulator). The per-case value is computed exactly from it: only voxels in
the buckets that contain a threshold are sorted. The pooled value over cases cannot be exact
without storing every confidence; it snaps each threshold to the upper edge of its bucket,
and moving a voxel between two bins changes the ECE by at most 2/N, so

    |pooled AdaECE - exact AdaECE of all voxels| <= 2 * (voxels in threshold buckets) / N,

reported alongside as ``adaptive_ece_max_error``.
"""

from __future__ import annotations

import math

import torch

from mcseg.metrics.binning import BinSums, bin_sums

__all__ = ["N_FINE", "fine_bucket", "fine_histogram", "adaptive_ece", "adaptive_ece_from_histogram"]

_SHIFT = 13  # float32 bits kept: sign, 8 exponent, 10 mantissa -> 1024 buckets per octave
_U_MIN = 2.0**-26  # below the float32 resolution of 1 - r near 1 (2^-24)


def _key(u: float) -> int:
    return int(torch.tensor(u, dtype=torch.float32).view(torch.int32)) >> _SHIFT


_KEY_ONE, _KEY_MIN = _key(1.0), _key(_U_MIN)
N_FINE = _KEY_ONE - _KEY_MIN + 1


def fine_bucket(confidence: torch.Tensor) -> torch.Tensor:
    """Fine bucket of each confidence, non-decreasing in the confidence.

    The bit pattern of a non-negative float, read as an integer, is monotone in its value, so
    dropping the low mantissa bits of u = 1 - r gives log-spaced buckets in one integer shift.
    """
    u = (1.0 - confidence.clamp(0.0, 1.0)).float().clamp_(min=_U_MIN)
    return _KEY_ONE - (u.view(torch.int32) >> _SHIFT).long()


def fine_histogram(confidence: torch.Tensor, correct: torch.Tensor, keys: torch.Tensor | None = None) -> BinSums:
    return bin_sums(fine_bucket(confidence) if keys is None else keys, confidence, correct, N_FINE)


def _layout(fine: BinSums, n_bins: int) -> tuple[BinSums, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Occupied buckets (ids and sums), the 1-based ranks ceil(b N / M) of the thresholds
    (b = 1..M-1), the position among occupied buckets of the bucket holding each rank, and the
    equal-mass bin of every occupied bucket when each threshold is snapped to its bucket's top."""
    occupied = fine.count.nonzero()[:, 0]
    sums = fine[occupied]
    cum = sums.count.cumsum(0)
    n = int(cum[-1].item())
    b = torch.arange(1, n_bins, device=cum.device, dtype=torch.int64)
    ranks = (b * n + n_bins - 1) // n_bins
    holder = torch.searchsorted(cum, ranks.double())
    group = torch.searchsorted(holder, torch.arange(occupied.numel(), device=cum.device))  # #{b: holder_b < j}
    return sums, occupied, ranks, holder, group


def adaptive_ece(
    confidence: torch.Tensor,
    correct: torch.Tensor,
    n_bins: int = 15,
    fine: BinSums | None = None,
    keys: torch.Tensor | None = None,
) -> float:
    """Exact AdaECE of one set of voxels (1-D ``confidence`` and boolean ``correct``).

    ``keys``/``fine`` (from :func:`fine_bucket`/:func:`fine_histogram`) may be passed when
    already computed. NaN for no voxels.
    """
    if confidence.numel() == 0:
        return math.nan
    keys = fine_bucket(confidence) if keys is None else keys
    fine = fine_histogram(confidence, correct, keys) if fine is None else fine
    sums, occupied, ranks, holder, group = _layout(fine, n_bins)
    # the voxels of the threshold buckets, sorted: the exact thresholds are among them
    boundary = torch.unique(holder)
    is_boundary = torch.zeros(N_FINE, dtype=torch.bool, device=keys.device)
    is_boundary[occupied[boundary]] = True
    selected = is_boundary[keys]
    sub_conf, order = confidence[selected].sort()
    sub_correct = correct[selected][order]
    # rank -> position in the sorted subset: skip the voxels of the lower, non-threshold buckets
    below = sums.count.cumsum(0)[holder] - sums.count[holder]
    sub_count = sums.count[boundary]
    sub_below = (sub_count.cumsum(0) - sub_count)[torch.searchsorted(boundary, holder)]
    thresholds = sub_conf[ranks - 1 - below.long() + sub_below.long()]
    # a bucket without a threshold lies wholly in its snapped bin; threshold buckets voxel by voxel
    outside = torch.ones(occupied.numel(), dtype=torch.float64, device=keys.device).index_fill_(0, boundary, 0.0)
    outside = BinSums(sums.count * outside, sums.confidence * outside, sums.correct * outside).regroup(group, n_bins)
    inside = bin_sums(torch.searchsorted(thresholds, sub_conf), sub_conf, sub_correct, n_bins)
    return float((outside + inside).ece())


def adaptive_ece_from_histogram(fine: BinSums, n_bins: int = 15) -> tuple[float, float]:
    """Approximate AdaECE from a (pooled) fine histogram and the bound on its error (see module)."""
    if float(fine.count.sum()) == 0:
        return math.nan, math.nan
    sums, _, _, holder, group = _layout(fine, n_bins)
    bound = 2.0 * float(sums.count[torch.unique(holder)].sum() / sums.count.sum())
    return float(sums.regroup(group, n_bins).ece()), bound

"""Per-bin sums, the one data structure behind every binned calibration metric.

A :class:`BinSums` holds, for each bin, the number of voxels, the sum of their confidences
and the number of correct ones, in float64 on the probabilities' device. Sums add, so the
pooled value over cases is the metric of the summed bins, and no voxel list is stored.

Equal-width bins follow Guo et al. (ICML 2017): B_b = (b/M, (b+1)/M], b = 0..M-1, with 0 in
B_0 and 1 in B_{M-1}. Binning is exact with respect to the real edges b/M, not their rounded
floats. (torchmetrics bins [lo, hi) with an extra bin for exactly 1.0; MONAI's default
``right=False`` is (lo, hi] despite its docstring, with float32 edges scaled by 1 + eps.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
import torch

__all__ = ["BinSums", "bin_index", "bin_sums", "edges_below"]


@dataclass(frozen=True)
class BinSums:
    """Per-bin count, sum of confidence and number correct, shape ``(..., n_bins)``, float64.

    For a bin b with n_b voxels, conf_b = confidence_b / n_b and acc_b = correct_b / n_b.
    """

    count: torch.Tensor
    confidence: torch.Tensor
    correct: torch.Tensor

    @classmethod
    def zeros(cls, *shape: int, device: torch.device | str | None = None) -> BinSums:
        z = torch.zeros(shape, dtype=torch.float64, device=device)
        return cls(z, z.clone(), z.clone())

    @classmethod
    def stack(cls, rows: Sequence[BinSums]) -> BinSums:
        return cls(*(torch.stack([getattr(r, f) for r in rows]) for f in ("count", "confidence", "correct")))

    def __getitem__(self, index) -> BinSums:
        return BinSums(self.count[index], self.confidence[index], self.correct[index])

    def __add__(self, other: BinSums) -> BinSums:
        return BinSums(self.count + other.count, self.confidence + other.confidence, self.correct + other.correct)

    def to(self, device: torch.device | str) -> BinSums:
        return BinSums(self.count.to(device), self.confidence.to(device), self.correct.to(device))

    def regroup(self, group: torch.Tensor, n_groups: int) -> BinSums:
        """Merge bins: bin i of the last axis goes to group ``group[i]``."""
        def merge(t: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(*t.shape[:-1], n_groups, dtype=t.dtype, device=t.device)
            return out.index_add_(-1, group, t)
        return BinSums(merge(self.count), merge(self.confidence), merge(self.correct))

    def ece(self) -> torch.Tensor:
        """sum_b n_b/N |acc_b - conf_b| = sum_b |correct_b - confidence_b| / N; NaN when N = 0."""
        n = self.count.sum(-1)
        gap = (self.correct - self.confidence).abs().sum(-1)
        return torch.where(n > 0, gap / n.clamp_min(1), torch.nan)

    def signed_ece(self) -> torch.Tensor:
        """sum_b n_b/N (conf_b - acc_b), positive when over-confident: ECE+ - ECE- of torch-uncertainty's
        ``direction`` (PR #342). The count weights cancel, so it is (sum of confidence - number correct) / N
        for any binning; NaN when N = 0."""
        n = self.count.sum(-1)
        gap = (self.confidence - self.correct).sum(-1)
        return torch.where(n > 0, gap / n.clamp_min(1), torch.nan)

    def mce(self) -> torch.Tensor:
        """max over non-empty bins of |acc_b - conf_b|; NaN when every bin is empty."""
        gap = (self.correct - self.confidence).abs() / self.count.clamp_min(1)
        worst = torch.where(self.count > 0, gap, -torch.inf).amax(-1)
        return torch.where(worst >= 0, worst, torch.nan)


@lru_cache(maxsize=None)
def edges_below(n_bins: int, dtype: torch.dtype) -> tuple[float, ...]:
    """Largest value of ``dtype`` that is <= b/M, for b = 0..M (exact, via fractions)."""
    edges = []
    for b in range(n_bins + 1):
        v = torch.tensor(b / n_bins, dtype=dtype)
        while Fraction(v.item()) > Fraction(b, n_bins):
            v = torch.nextafter(v, torch.tensor(-math.inf, dtype=dtype))
        edges.append(v.item())
    return tuple(edges)


def bin_index(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """0-based bin of each value in [0, 1] for B_b = (b/M, (b+1)/M] (0 goes to bin 0).

    ceil(v * M) is the 1-based bin except where rounding of v * M lands exactly on an integer
    while v lies just above that edge; those values are re-tested against the exact edges.
    """
    scaled = values * n_bins
    upper = torch.ceil(scaled)
    on_edge = scaled == upper
    if bool(on_edge.any()):
        edges = torch.tensor(edges_below(n_bins, values.dtype), dtype=values.dtype, device=values.device)
        k = upper[on_edge]
        above = values[on_edge] > edges[k.long().clamp(0, n_bins)]
        upper[on_edge] = k + above.to(k.dtype)
    return upper.clamp_(1, n_bins).long() - 1


def bin_sums(bins: torch.Tensor, values: torch.Tensor, correct: torch.Tensor, n_bins: int) -> BinSums:
    """Sums over voxels grouped by ``bins`` (0-based indices < n_bins); ``correct`` boolean.

    On the CPU with NumPy's ``bincount``, which adds a bin's weights in voxel order as ``index_add_`` does (the
    same sums to the last bit) in fewer passes: most of the time of a small case's fine histogram (26,625 bins)
    was torch's per-call work around it."""
    if bins.device.type == "cpu":
        b, hit = bins.numpy(), correct.detach().numpy()
        pairs = b * 2 + (hit if hit.dtype == bool else hit.astype(np.int64))
        joint = np.bincount(pairs, minlength=2 * n_bins).reshape(n_bins, 2).astype(np.float64)
        conf = np.bincount(b, values.detach().double().numpy(), n_bins)
        return BinSums(torch.from_numpy(joint.sum(1)), torch.from_numpy(conf), torch.from_numpy(joint[:, 1].copy()))
    # count and correct from one integer histogram over (bin, correct) pairs
    joint = torch.bincount(bins * 2 + correct.long(), minlength=2 * n_bins).view(n_bins, 2).double()
    conf = torch.zeros(n_bins, dtype=torch.float64, device=values.device).index_add_(0, bins, values.double())
    return BinSums(joint.sum(1), conf, joint[:, 1].clone())

"""Streaming calibration accumulators: one pass over a case's probabilities on their device.

Notation: the N voxels of the region, probabilities p in the simplex over the task's K
classes, label y, top-label confidence r = max_k p_k, prediction yhat = argmax_k p_k (first
maximum), M equal-width bins (lo, hi] (:mod:`mcseg.metrics.binning`).

* ECE (Guo et al., ICML 2017) = sum_b |B_b|/N |acc(B_b) - conf(B_b)|, bins over r, acc = 1[yhat = y].
* MCE (Naeini et al., AAAI 2015; Guo et al. 2017) = max over non-empty bins of |acc - conf|.
* Classwise ECE (Kumar et al., NeurIPS 2019; "static calibration error" of Nixon et al., CVPRW
  2019) = (1/K) sum_k ECE_k, ECE_k with bins over p_k for every voxel of the region and
  accuracy 1[y = k]. K is the task's number of classes, background included; a class absent
  from the label still counts (its ECE_k measures the probability mass put on it).
* Adaptive ECE: top-label equal-mass AdaECE, see :mod:`mcseg.metrics.adaptive`.
* Smooth ECE (Blasiok & Nakkiran, ICLR 2024), top-label: :mod:`mcseg.metrics.smooth_ece`.
* Signed ECE = sum_b |B_b|/N (conf(B_b) - acc(B_b)) = mean r - mean accuracy: positive when over-confident.
* NLL = -(1/N) sum log max(p_y, 1e-12) (the clamp caps a voxel at 27.6 nats).
* Brier = (1/N) sum_v sum_k (p_k - 1[y = k])^2, summed over classes, NOT divided by K.

Everything is a sum (:class:`CalibrationStats`), so per-case values and values pooled over the
cases of a split come from the same accumulators; the memory is that of a few voxel-sized
temporaries, independent of the number of cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mcseg.metrics import adaptive
from mcseg.metrics.base import CaseMetric
from mcseg.metrics.binning import BinSums, bin_index, bin_sums, edges_below
from mcseg.metrics.smooth_ece import SmoothSums, smooth_ece, smooth_sums

__all__ = [
    "CalibrationStats",
    "CaseCalibration",
    "case_calibration",
    "top_label",
    "class_sums",
    "CalibrationMetric",
    "NLL_FLOOR",
]

NLL_FLOOR = 1e-12


@dataclass(frozen=True)
class CalibrationStats:
    """Additive sufficient statistics of the calibration metrics of a set of voxels."""

    top: BinSums  # (M,) over the top-label confidence
    classwise: BinSums  # (K, M) over each class probability
    fine: BinSums  # (N_FINE,) top-label confidence on the fine grid (pooled adaptive ECE)
    nll_sum: torch.Tensor  # () float64
    brier_sum: torch.Tensor  # () float64
    smooth: SmoothSums  # top-label confidence and correctness on the smooth ECE's cells

    @classmethod
    def zeros(cls, num_classes: int, n_bins: int, device: torch.device | str | None = None) -> CalibrationStats:
        z = torch.zeros((), dtype=torch.float64, device=device)
        return cls(BinSums.zeros(n_bins, device=device), BinSums.zeros(num_classes, n_bins, device=device),
                   BinSums.zeros(adaptive.N_FINE, device=device), z, z.clone(), SmoothSums.zeros(device=device))

    def __add__(self, other: CalibrationStats) -> CalibrationStats:
        return CalibrationStats(self.top + other.top, self.classwise + other.classwise, self.fine + other.fine,
                                self.nll_sum + other.nll_sum, self.brier_sum + other.brier_sum,
                                self.smooth + other.smooth)

    def __iadd__(self, other: CalibrationStats) -> CalibrationStats:
        """``self + other`` added into this accumulator's own tensors (the same bits as ``+``), the smooth ECE's
        sums in place once dense (:meth:`SmoothSums.__iadd__`): pooling a thousand cases allocates no 640 kB of
        fine bins and no 40 MB of smooth cells per case. Only for an accumulator that owns its tensors: start one
        with :meth:`copy`."""
        for mine, theirs in ((self.top, other.top), (self.classwise, other.classwise), (self.fine, other.fine)):
            for name in ("count", "confidence", "correct"):
                getattr(mine, name).add_(getattr(theirs, name))
        self.nll_sum.add_(other.nll_sum)
        self.brier_sum.add_(other.brier_sum)
        smooth = self.smooth
        smooth += other.smooth
        object.__setattr__(self, "smooth", smooth)
        return self

    def copy(self) -> CalibrationStats:
        """An accumulator of its own, equal to this: its tensors cloned."""
        def bins(b: BinSums) -> BinSums:
            return BinSums(b.count.clone(), b.confidence.clone(), b.correct.clone())
        sm = self.smooth
        smooth = SmoothSums(*(getattr(sm, name).clone() for name in SmoothSums.SUMS),
                            cells=None if sm.cells is None else sm.cells.clone())
        return CalibrationStats(bins(self.top), bins(self.classwise), bins(self.fine), self.nll_sum.clone(),
                                self.brier_sum.clone(), smooth)

    @property
    def n_voxels(self) -> int:
        return int(self.top.count.sum().item())

    def values(self, adaptive_from_histogram: bool = True) -> dict[str, float | list[float]]:
        """ECE, MCE, classwise ECE (and its per-class terms), adaptive ECE from the fine histogram
        with its error bound (or NaN when not asked for), smooth and signed ECE, NLL and Brier; NaN for an
        empty region."""
        n = self.n_voxels
        ada, ada_bound = (adaptive.adaptive_ece_from_histogram(self.fine, self.top.count.numel())
                          if adaptive_from_histogram else (math.nan, math.nan))
        class_ece = self.classwise.ece()
        return {
            "ece": float(self.top.ece()),
            "mce": float(self.top.mce()),
            "classwise_ece": float(class_ece.mean()),
            "class_ece": class_ece.tolist(),
            "adaptive_ece": ada,
            "adaptive_ece_max_error": ada_bound,
            "smooth_ece": smooth_ece(self.smooth),
            "signed_ece": float(self.top.signed_ece()),
            "nll": float(self.nll_sum) / n if n else math.nan,
            "brier": float(self.brier_sum) / n if n else math.nan,
            "n_voxels": n,
        }


@dataclass(frozen=True)
class CaseCalibration:
    """One case: its additive statistics and its exact adaptive ECE."""

    stats: CalibrationStats
    adaptive_ece: float
    values: dict = field(init=False)

    def __post_init__(self) -> None:
        values = self.stats.values(adaptive_from_histogram=False)
        values["adaptive_ece"] = self.adaptive_ece
        values["adaptive_ece_max_error"] = 0.0 if values["n_voxels"] else math.nan
        object.__setattr__(self, "values", values)


# voxels per step of the class loop: on CPU the temporaries stay in cache; on GPU, few launches
CHUNK_VOXELS = {"cpu": 1 << 17, "cuda": 1 << 22}


# up to this many classes every (class, voxel) pair is binned (K passes of cheap arithmetic beat a nonzero and a
# gather of the pairs above bin 0); beyond, only the pairs above bin 0, which most of them are not
_BIN_ALL_CLASSES = 4


def _chunks(n: int, device: torch.device):
    size = CHUNK_VOXELS.get(device.type, 1 << 20)
    return (slice(start, min(start + size, n)) for start in range(0, n, size))


def top_label(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-label confidence and prediction (first maximum, as ``argmax``) of ``K x *spatial``
    probabilities, flattened over voxels. The prediction is uint8 up to 256 classes (a label
    map's compact type: 1 byte a voxel instead of argmax's 8 on a whole-volume case)."""
    conf, pred = probs.reshape(probs.shape[0], -1).max(0)
    return conf, pred.to(torch.uint8) if probs.shape[0] <= 256 else pred


def class_sums(
    probs: torch.Tensor, label: torch.Tensor, n_bins: int, mask: torch.Tensor | None = None
) -> tuple[BinSums, torch.Tensor, torch.Tensor]:
    """Per-class bin sums (K, M) over p_k with correctness 1[y = k], and the NLL and Brier sums.

    ``probs``: (K, N) float, ``label``: (N,) integer, ``mask``: (N,) bool or None. One-hot free:
    the correct counts of all classes come from one histogram of (y, bin of p_y); each class
    bin histogram comes from one histogram of (k, bin of p_k).
    """
    k_classes, n_bins_total = probs.shape[0], probs.shape[0] * n_bins
    device = probs.device
    count = torch.zeros(n_bins_total, dtype=torch.float64, device=device)
    conf = torch.zeros_like(count)
    correct = torch.zeros(n_bins_total, dtype=torch.int64, device=device)
    total = torch.zeros(k_classes, dtype=torch.float64, device=device)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # voxels, NLL, Brier
    first_edge = edges_below(n_bins, probs.dtype)[1]
    offset = torch.arange(k_classes, device=device) * n_bins
    for s in _chunks(probs.shape[1], device):
        x, y = probs[:, s], label[s].long()
        if mask is not None:
            x, y = x[:, mask[s]], y[mask[s]]
        xd = x.double().reshape(-1)
        if k_classes <= _BIN_ALL_CLASSES:  # every (class, voxel) pair binned, class-major as the nonzero below
            bins = (bin_index(x, n_bins) + offset[:, None]).reshape(-1)
            p_true = x.gather(0, y[None])[0]
            correct += torch.bincount(bins.view(k_classes, -1).gather(0, y[None])[0], minlength=n_bins_total)
            count += torch.bincount(bins, minlength=n_bins_total)
            conf += torch.bincount(bins, weights=xd, minlength=n_bins_total)  # bin 0's sums replaced below
        else:
            p_true = x.gather(0, y[None])[0]
            correct += torch.bincount(y * n_bins + bin_index(p_true, n_bins), minlength=n_bins_total)
            # most (class, voxel) pairs put p_k in bin 0 = [0, 1/M]: bin only the others, and get
            # bin 0 as the complement of the class totals
            k, v = (x > first_edge).nonzero(as_tuple=True)
            above = x[k, v]
            bins = bin_index(above, n_bins) + offset[k]
            count += torch.bincount(bins, minlength=n_bins_total)
            conf += torch.bincount(bins, weights=above.double(), minlength=n_bins_total)
        total += xd.view(k_classes, -1).sum(1)
        # Brier per voxel: sum_k p_k^2 - 2 p_y + 1
        sums += torch.stack([torch.tensor(y.numel(), dtype=torch.float64, device=device),
                             -p_true.double().clamp_min(NLL_FLOOR).log().sum(),
                             torch.dot(xd, xd) - 2.0 * p_true.double().sum() + y.numel()])
    count, conf = count.view(k_classes, n_bins), conf.view(k_classes, n_bins)
    count[:, 0] = sums[0] - count[:, 1:].sum(1)
    conf[:, 0] = total - conf[:, 1:].sum(1)
    return BinSums(count, conf, correct.view(k_classes, n_bins).double()), sums[1], sums[2]


def case_calibration(
    probs: torch.Tensor,
    label: torch.Tensor,
    n_bins: int = 15,
    mask: torch.Tensor | None = None,
    top: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> CaseCalibration:
    """Calibration statistics of one case over a voxel region.

    Args:
        probs: ``K x *spatial`` probabilities (fp16/bf16 are computed in fp32).
        label: ``*spatial`` integer labels in [0, K).
        n_bins: number of equal-width bins M.
        mask: ``*spatial`` boolean region, or None for every voxel.
        top: ``top_label(probs)`` when already computed.
    """
    if probs.shape[1:] != label.shape:
        raise ValueError(f"probabilities {tuple(probs.shape)} and label {tuple(label.shape)} do not match")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    p = probs.reshape(probs.shape[0], -1)
    if p.dtype in (torch.float16, torch.bfloat16):
        p = p.float()
    y = label.reshape(-1).to(device=p.device)  # its own integer type: class_sums widens chunk by chunk
    if y.is_floating_point() or y.dtype == torch.bool:
        y = y.long()
    if y.numel():
        lo, hi = (int(v) for v in torch.aminmax(y))
        if lo < 0 or hi >= p.shape[0]:
            raise ValueError(f"label values must lie in [0, {p.shape[0]}), found [{lo}, {hi}]")
    conf, pred = top_label(p) if top is None else (top[0].reshape(-1).to(p.dtype), top[1].reshape(-1))
    m = None if mask is None else mask.reshape(-1).to(p.device)
    classwise, nll_sum, brier_sum = class_sums(p, y, n_bins, m)
    if m is not None:
        conf, pred, y = conf[m], pred[m], y[m]
    correct = pred == y
    keys = adaptive.fine_bucket(conf)
    fine = adaptive.fine_histogram(conf, correct, keys)
    stats = CalibrationStats(bin_sums(bin_index(conf, n_bins), conf, correct, n_bins), classwise, fine,
                             nll_sum, brier_sum, smooth_sums(conf, correct))
    return CaseCalibration(stats, adaptive.adaptive_ece(conf, correct, n_bins, fine, keys))


class CalibrationMetric(CaseMetric):
    """Per-case calibration values (call), pooled values over all cases (``aggregate``).

    Only the per-case values and one running :class:`CalibrationStats` are kept.
    """

    def __init__(self, num_classes: int, n_bins: int = 15) -> None:
        super().__init__()
        self.num_classes, self.n_bins = num_classes, n_bins
        self.pooled: CalibrationStats | None = None

    def compute(self, probs: torch.Tensor, label: torch.Tensor, mask: torch.Tensor | None = None) -> dict:
        if probs.shape[0] != self.num_classes:
            raise ValueError(f"expected {self.num_classes} probability channels, got {probs.shape[0]}")
        case = case_calibration(probs, label, self.n_bins, mask)
        if self.pooled is None:
            self.pooled = case.stats.copy()
        else:
            self.pooled += case.stats
        return case.values

    def aggregate(self) -> dict:
        stats = self.pooled or CalibrationStats.zeros(self.num_classes, self.n_bins)
        return stats.values()

    def reset(self) -> None:
        super().reset()
        self.pooled = None

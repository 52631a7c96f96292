"""Histogram binning and isotonic regression, classwise one-versus-rest with renormalisation: the classic
non-parametric post-hoc calibrators that segmentation papers compare against (Zadrozny & Elkan, KDD 2001 and
2002; netcal 1.4 and torch-uncertainty implement them this way; ../shared/reference/posthoc_and_conformal.md, A8).

For probabilities p (N voxels x C classes) and labels y, each class c gets a monotone map h_c fitted on the
pairs (p_c, 1[y = c]) of the fit voxels, and a voxel's calibrated probabilities are

    q_c = h_c(p_c) / sum_k h_k(p_k).

* :class:`HistogramBinning`: h_c is constant on M equal-width bins (lo, hi] (0 in the first bin: mcseg's ECE bins,
  :func:`mcseg.metrics.binning.bin_index`), the fraction of class-c voxels among the fit voxels in the bin; an empty
  bin keeps its centre.
* :class:`IsotonicCalibration`: h_c is scikit-learn's ``IsotonicRegression(y_min=0, y_max=1, increasing=True,
  out_of_bounds="clip")`` fitted on the same pairs (the pool-adjacent-violators fit of Zadrozny & Elkan 2002).

Policies (stated, as the references differ): a class absent from the fit labels maps to 0 (netcal and
torch-uncertainty alike); a voxel whose maps are all 0 gets the uniform 1/C (netcal returns NaN there). Neither
calibrator keeps the arg-max in general: :meth:`argmax_changes` counts the voxels whose class changes.
"""
from __future__ import annotations

import numpy as np
import torch

from mcseg.metrics.binning import bin_index

__all__ = ["HistogramBinning", "IsotonicCalibration"]


def _checked(probs: np.ndarray, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"probabilities of shape {p.shape}: expected N voxels x C >= 2 classes")
    if not np.isfinite(p).all() or p.min() < 0 or p.max() > 1:
        raise ValueError("probabilities must be finite and in [0, 1]")
    if labels is None:
        return p, None
    y = np.asarray(labels)
    if y.shape != (p.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels of shape {y.shape} and type {y.dtype}: expected {p.shape[0]} integers")
    if y.size and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ValueError(f"labels must lie in [0, {p.shape[1]}), found [{y.min()}, {y.max()}]")
    return p, y


class _OneVersusRest:
    """The shared part: fit one map per class, apply, renormalise."""

    def fit(self, probs, labels) -> _OneVersusRest:
        p, y = _checked(probs, labels)
        if p.shape[0] == 0:
            raise ValueError("no voxel to fit on")
        self.n_classes = p.shape[1]
        self.present = [bool((y == c).any()) for c in range(self.n_classes)]
        self._fit([p[:, c] for c in range(self.n_classes)], [(y == c).astype(np.float64) for c in range(self.n_classes)])
        return self

    def transform(self, probs) -> np.ndarray:
        p, _ = _checked(probs)
        if p.shape[1] != getattr(self, "n_classes", None):
            raise ValueError(f"probabilities with {p.shape[1]} classes, the calibrator was fitted on "
                             f"{getattr(self, 'n_classes', 'none (not fitted)')}")
        mapped = np.stack([self._map(c, p[:, c]) if self.present[c] else np.zeros(p.shape[0])
                           for c in range(self.n_classes)], axis=1)
        total = mapped.sum(axis=1, keepdims=True)
        return np.where(total > 0, mapped / np.where(total > 0, total, 1.0), 1.0 / self.n_classes)

    def argmax_changes(self, probs) -> int:
        """How many voxels change their arg-max (first maximum) when calibrated."""
        p, _ = _checked(probs)
        return int((self.transform(p).argmax(axis=1) != p.argmax(axis=1)).sum())


class HistogramBinning(_OneVersusRest):
    """Classwise histogram binning (module docstring) with ``n_bins`` equal-width bins."""

    def __init__(self, n_bins: int = 15) -> None:
        if not isinstance(n_bins, int) or n_bins < 1:
            raise ValueError(f"n_bins={n_bins!r}: expected an integer >= 1")
        self.n_bins = n_bins

    def _bins(self, values: np.ndarray) -> np.ndarray:
        return bin_index(torch.from_numpy(values), self.n_bins).numpy()

    def _fit(self, values: list[np.ndarray], hits: list[np.ndarray]) -> None:
        centres = (np.arange(self.n_bins) + 0.5) / self.n_bins
        self.values = []
        for v, h in zip(values, hits):
            b = self._bins(v)
            count = np.bincount(b, minlength=self.n_bins)
            hit = np.bincount(b, weights=h, minlength=self.n_bins)
            self.values.append(np.where(count > 0, hit / np.maximum(count, 1), centres))

    def _map(self, c: int, values: np.ndarray) -> np.ndarray:
        return self.values[c][self._bins(values)]


class IsotonicCalibration(_OneVersusRest):
    """Classwise isotonic regression (module docstring), on scikit-learn's ``IsotonicRegression``."""

    def _fit(self, values: list[np.ndarray], hits: list[np.ndarray]) -> None:
        from sklearn.isotonic import IsotonicRegression

        self.maps = [IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(v, h)
                     for v, h in zip(values, hits)]

    def _map(self, c: int, values: np.ndarray) -> np.ndarray:
        return self.maps[c].predict(values)

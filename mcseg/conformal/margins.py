"""Conformal margins in mm: how far a predicted structure must be grown to cover the ground truth, and shrunk to
lie inside it (morphological conformal sets, ConSeMa, MICCAI 2025; ../shared/reference/posthoc_and_conformal.md, B7).

Per case and class, with P the predicted mask, G the ground truth and distances Euclidean in mm with the case's
voxel spacing (``scipy.ndimage.distance_transform_edt(..., sampling=spacing)``, exact, between voxel centres):

* **outer** score: the smallest d such that the grown mask ``{v : dist(v, P) <= d}`` covers a fraction >= tau of G,
  i.e. the ceil(tau |G|)-th smallest distance from a voxel of G to the nearest voxel of P (tau = 1: the directed
  Hausdorff distance G -> P). ConSeMa grows by k dilations with a 3 x 3 cross (city-block distance in voxels, 2-D);
  this is its generalisation to 3-D in mm (not in ConSeMa's code). An empty P with a non-empty G scores inf.
* **inner** score: the smallest d such that the shrunk mask ``{v in P : depth(v) > d}`` lies inside G, where depth
  is the distance from a voxel of P to the nearest voxel outside P (the volume's border counts as outside): the
  largest depth of a voxel of P \\ G, 0 when P lies inside G. (ConSeMa has no inner margin.)
* **conformal quantile** at 1 - alpha: the k-th smallest of the n calibration scores, k = ceil((n + 1)(1 - alpha)),
  inf when k > n (alpha < 1/(n + 1): no finite margin). Not ConSeMa's index, which takes one order statistic more.

Guarantee, for a new case exchangeable with the n calibration cases: P(the grown mask covers >= tau of G) >= 1 - alpha,
and separately P(the shrunk mask lies inside G) >= 1 - alpha.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["conformal_quantile", "depth", "distance_to", "grown", "inner_score", "outer_score", "shrunk"]


def distance_to(mask: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """mm from every voxel to the nearest voxel of ``mask`` (0 inside it; inf everywhere for an empty mask)."""
    from scipy.ndimage import distance_transform_edt  # here: scipy.ndimage takes ~1 s to import (docs/benchmarks.md)

    mask = np.asarray(mask, bool)
    if not mask.any():
        return np.full(mask.shape, np.inf)
    return distance_transform_edt(~mask, sampling=[float(s) for s in spacing])


def depth(mask: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """mm from every voxel of ``mask`` to the nearest voxel outside it, the volume's border counting as outside
    (0 outside the mask)."""
    from scipy.ndimage import distance_transform_edt

    mask = np.asarray(mask, bool)
    padded = np.pad(mask, 1, constant_values=False)
    inner = tuple(slice(1, -1) for _ in range(mask.ndim))
    return distance_transform_edt(padded, sampling=[float(s) for s in spacing])[inner]


def outer_score(pred: np.ndarray, truth: np.ndarray, spacing: Sequence[float], tau: float = 1.0) -> float:
    """The outer margin of one case (module docstring); 0 for an empty ground truth."""
    truth = np.asarray(truth, bool)
    if not 0 < tau <= 1:
        raise ValueError(f"coverage ratio tau {tau}: expected 0 < tau <= 1")
    size = int(truth.sum())
    if size == 0:
        return 0.0
    distances = np.sort(distance_to(pred, spacing)[truth])
    covered = np.arange(1, size + 1) / size >= tau  # ConSeMa's comparison, count / |G| >= tau, not ceil(tau |G|)
    return float(distances[int(np.argmax(covered))])


def inner_score(pred: np.ndarray, truth: np.ndarray, spacing: Sequence[float]) -> float:
    """The inner margin of one case (module docstring)."""
    pred, truth = np.asarray(pred, bool), np.asarray(truth, bool)
    outside = pred & ~truth
    return float(depth(pred, spacing)[outside].max()) if outside.any() else 0.0


def conformal_quantile(scores: Sequence[float], alpha: float) -> float:
    """The k-th smallest score, k = ceil((n + 1)(1 - alpha)); inf when k > n or there is no score."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha}: expected 0 < alpha < 1")
    values = np.sort(np.asarray(scores, np.float64))
    k = math.ceil((len(values) + 1) * (1 - alpha) - 1e-12)  # (n + 1)(1 - alpha) can land a rounding above an integer
    return float(values[k - 1]) if 0 < k <= len(values) else math.inf


def grown(pred: np.ndarray, spacing: Sequence[float], margin: float) -> np.ndarray:
    """The "possible" mask: voxels within ``margin`` mm of the prediction (everything for an infinite margin)."""
    if math.isinf(margin):
        return np.ones(np.shape(pred), bool)
    return distance_to(pred, spacing) <= margin


def shrunk(pred: np.ndarray, spacing: Sequence[float], margin: float) -> np.ndarray:
    """The "sure" mask: voxels of the prediction deeper than ``margin`` mm (nothing for an infinite margin)."""
    return depth(pred, spacing) > margin

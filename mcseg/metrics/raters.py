"""Overlap against several raters: per rater, on the consensus regions, against STAPLE, thresholded means.

Notation: K raters' label maps y_1..y_K (``K x *S``, integer, values in [0, C)), a prediction (an integer
map, or probabilities ``C x *S``), the rater mean m_c = (1/K) sum_r [y_r = c] (the fraction of raters that
gave class c). Definitions follow the challenges' code (../shared/reference/multirater_and_interop.md,
Part A); figures that reproduce a quirk of a challenge's code carry its name.

* Per-rater Dice and HD95: mcseg's Dice and HD (:mod:`mcseg.metrics.overlap`, :mod:`mcseg.metrics.surface`)
  against each rater, and their mean over raters (NaN raters skipped).
* Consensus regions of class c: F_c = every rater gave c, B_c = no rater gave c, D_c = the rest
  (dissensus). :func:`consensus_dice`: one 3D Dice per class of (pred = c and not D_c) against F_c, the
  "Dice on consensus foreground and background only" of the CURVAS 2024 description (both empty: NaN).
* :func:`curvas_row_dice`: the same regions scored as the CURVAS 2024 code does: its 3D arrays go to MONAI's
  ``DiceMetric(include_background=False, reduction="mean", ignore_empty=True)`` without batch or channel
  axes, so MONAI reads the slice axis as the batch, the next as the channel (row 0 dropped as
  "background") and scores 1D Dices along the last; a row with an empty consensus reference is NaN and
  skipped; the mean is MONAI's two-stage one (over rows per slice, then over slices with a defined row).
  mcseg arrays are NIfTI order (x, y, z); the code's arrays are SimpleITK's (z, y, x): ``axes=(2, 1, 0)``.
* STAPLE Dice is mcseg's Dice against the STAPLE consensus (:func:`mcseg.data.raters.staple_reference`).
* :func:`thresholded_dice` (QUBIQ): per foreground class, Dice(p_c > t, m_c > t) averaged over thresholds t
  (strict comparisons; both masks empty: Dice 1, as CURVAS 2025's code). ``QUBIQ_THRESHOLDS`` (0.1 .. 0.9)
  is the documented default, ``CURVAS2025_THRESHOLDS`` = linspace(0.1, 0.8, 6) its preset.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from mcseg.metrics.overlap import dice
from mcseg.metrics.surface import surface_distances

__all__ = [
    "QUBIQ_THRESHOLDS", "CURVAS2025_THRESHOLDS", "THRESHOLD_PRESETS", "thresholds_of",
    "binary_dice", "check_raters", "rater_mean", "consensus_regions", "per_rater_dice", "per_rater_hd", "consensus_dice", "curvas_row_dice",
    "thresholded_dice",
]

QUBIQ_THRESHOLDS = tuple(round(0.1 * i, 10) for i in range(1, 10))
CURVAS2025_THRESHOLDS = tuple(float(t) for t in np.linspace(0.1, 0.8, 6))
THRESHOLD_PRESETS = {"qubiq": QUBIQ_THRESHOLDS, "curvas2025": CURVAS2025_THRESHOLDS}


def thresholds_of(value: str | Sequence[float]) -> tuple[float, ...]:
    """A preset's name (``qubiq``, ``curvas2025``) or a list of thresholds in (0, 1)."""
    if isinstance(value, str):
        if value not in THRESHOLD_PRESETS:
            raise ValueError(f"thresholds={value!r}: expected a list of values in (0, 1) or one of "
                             f"{', '.join(THRESHOLD_PRESETS)}")
        return THRESHOLD_PRESETS[value]
    values = tuple(float(t) for t in value)
    if not values or not all(0.0 < t < 1.0 for t in values):
        raise ValueError(f"thresholds={list(value)}: expected one or more values in (0, 1)")
    return values


def check_raters(raters: torch.Tensor, num_classes: int, spatial: Sequence[int] | None = None) -> None:
    if raters.ndim < 2 or raters.shape[0] < 1:
        raise ValueError(f"raters of shape {tuple(raters.shape)}: expected K x *spatial label maps")
    if spatial is not None and tuple(raters.shape[1:]) != tuple(spatial):
        raise ValueError(f"raters {tuple(raters.shape[1:])} and prediction {tuple(spatial)} do not match")
    if raters.numel() == 0:  # no voxel (an empty mask): no value to check
        return
    lo, hi = (int(v) for v in torch.aminmax(raters))
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"rater label values must lie in [0, {num_classes}), found [{lo}, {hi}]")


def rater_mean(raters: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``C x *S``: the fraction of raters that gave each class (sums to 1 over classes)."""
    check_raters(raters, num_classes)
    out = torch.zeros((num_classes, *raters.shape[1:]), dtype=dtype, device=raters.device)
    for rater in raters:
        out.scatter_add_(0, rater.long()[None], torch.ones((1, *rater.shape), dtype=dtype, device=raters.device))
    return out / raters.shape[0]


def consensus_regions(raters: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(F_k, D_k)``: voxels every rater gave class k, and voxels where raters disagree about k."""
    hits = (raters == k).sum(0)
    return hits == raters.shape[0], (hits > 0) & (hits < raters.shape[0])


def per_rater_dice(pred: torch.Tensor, raters: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``K x C`` Dice of an integer prediction against each rater (background at index 0; NaN both empty)."""
    check_raters(raters, num_classes, pred.shape)
    return torch.stack([dice(pred, rater, num_classes) for rater in raters])


def per_rater_hd(pred: torch.Tensor, raters: torch.Tensor, num_classes: int, spacing: Sequence[float],
                 percentile: float = 95.0, definition: str = "max_directed") -> torch.Tensor:
    """``K x C`` HD (``percentile``, mm) against each rater, by :func:`~mcseg.metrics.surface.surface_distances`."""
    check_raters(raters, num_classes, pred.shape)
    return torch.stack([surface_distances(pred, rater, num_classes, spacing, percentile, definition).hd
                        for rater in raters])


def binary_dice(pred: torch.Tensor, ref: torch.Tensor) -> float:
    """Dice of two boolean masks; NaN when both are empty."""
    inter, total = int((pred & ref).sum()), int(pred.sum()) + int(ref.sum())
    return 2.0 * inter / total if total else math.nan


def consensus_dice(pred: torch.Tensor, raters: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``C`` 3D Dice per class on the consensus regions (index 0, background, NaN): the prediction of
    class k outside the dissensus D_k against F_k (module docstring)."""
    check_raters(raters, num_classes, pred.shape)
    out = torch.full((num_classes,), math.nan, dtype=torch.float64)
    for k in range(1, num_classes):
        full, dissensus = consensus_regions(raters, k)
        out[k] = binary_dice((pred == k) & ~dissensus, full)
    return out


def curvas_row_dice(pred: torch.Tensor, raters: torch.Tensor, num_classes: int,
                    axes: tuple[int, int, int] = (2, 1, 0)) -> torch.Tensor:
    """``C`` consensus Dice per class as the CURVAS 2024 code computes it (module docstring): 3D maps only;
    ``axes`` = (the axis MONAI takes as batch, as channel, the scored line) in the arrays' order."""
    check_raters(raters, num_classes, pred.shape)
    if pred.ndim != 3 or sorted(axes) != [0, 1, 2]:
        raise ValueError(f"curvas_row_dice needs 3D maps and a permutation of (0, 1, 2) as axes, got "
                         f"{pred.ndim}D and {axes}")
    out = torch.full((num_classes,), math.nan, dtype=torch.float64)
    for k in range(1, num_classes):
        full, dissensus = consensus_regions(raters, k)
        p = ((pred == k) & ~dissensus).permute(*axes)[:, 1:]  # batch x rows (row 0 is "background") x line
        g = full.permute(*axes)[:, 1:]
        inter, n_p, n_g = (p & g).sum(-1).double(), p.sum(-1).double(), g.sum(-1).double()
        row = torch.where(n_g > 0, 2.0 * inter / (n_p + n_g).clamp_min(1), torch.nan)  # ignore_empty
        defined = ~row.isnan()
        per_slice = torch.where(defined.any(1), row.nan_to_num(0.0).sum(1) / defined.sum(1).clamp_min(1), 0.0)
        slices = defined.any(1)
        out[k] = float(per_slice[slices].sum() / slices.sum()) if bool(slices.any()) else 0.0
    return out


def thresholded_dice(probs: torch.Tensor, raters: torch.Tensor, num_classes: int,
                     thresholds: str | Sequence[float] = QUBIQ_THRESHOLDS, eps: float = 0.0) -> torch.Tensor:
    """``C`` QUBIQ Dice per foreground class (index 0 NaN): mean over t of 2 |A_t & G_t| / (|A_t| + |G_t| + eps),
    A_t = p_c > t, G_t = m_c > t, both empty scoring 1 (module docstring; CURVAS-PDACVI's code adds eps = 1e-6 to
    the denominator). ``probs``: ``C x *S``."""
    check_raters(raters, num_classes, probs.shape[1:])
    if probs.shape[0] != num_classes:
        raise ValueError(f"expected {num_classes} probability channels, got {probs.shape[0]}")
    ts = thresholds_of(thresholds)
    mean = rater_mean(raters, num_classes, torch.float64)
    out = torch.full((num_classes,), math.nan, dtype=torch.float64)
    for k in range(1, num_classes):
        p, m = probs[k].double(), mean[k]
        scores = []
        for t in ts:
            a, g = p > t, m > t
            total = int(a.sum()) + int(g.sum())
            scores.append(2.0 * int((a & g).sum()) / (total + eps) if total else 1.0)
        out[k] = sum(scores) / len(scores)
    return out

"""The field's challenge metrics, as their authors' code computes them (docs/protocol.md, "Challenge metrics").

Pure functions of one case (numpy arrays or torch tensors of any spatial shape, 2D or 3D); every sum is
vectorised (cumulative sums, ``searchsorted``, a sparse contingency table), no loop over voxels, thresholds or
retention fractions. Each function states the code it follows, its empty-case policy and where it differs.

**Shifts MS lesions** (Raina et al. 2023; Malinin et al. 2022; github Shifts-Project/shifts, commit 81b8094,
``mswml/metrics.py`` and ``mswml/retention_curves.py``), binary tasks:

* :func:`normalised_dice` nDSC = 2 TP / (k FP + 2 TP + FN), k = (1 - r) |G| / (r (N - |G|)), r = 0.001, N the
  number of voxels scored; |G| = 0 gives k = 1. Empty case: prediction and reference both empty -> 1; an empty
  reference with a prediction -> 0 (TP = 0). Difference: where every voxel is reference (N = |G|) the authors'
  k is inf and 0 * inf gives NaN; here k FP := 0 when FP = 0 (the value is then the plain Dice).
* :func:`ndsc_retention_curve`: the voxels ordered by increasing uncertainty (numpy's default ``argsort``, as
  the authors: ties are in its order); at a retained fraction f the first int(N f) keep the prediction and the
  rest are replaced by the reference; the curve is the nDSC of that map (k from the whole reference, unchanged).
  :data:`SHIFTS_FRACTIONS` = log(1..200) / log(200) (the authors' 200 log-spaced fractions, from 0).
* :func:`ndsc_aac`: 1 - trapezoidal area under that curve (the authors' "nDSC R-AUC", which is the area ABOVE
  the curve: lower is better). Its mean over cases equals the authors' area of the mean curve
  (``retention_curves.py``), the trapezoid being linear in the curve.
* :func:`lesion_f1`: lesions are face-connected components (scipy ``ndimage.label``'s default structure); a
  predicted lesion is a TP if its largest IoU with a reference lesion it touches is >= the threshold, else a FP;
  a reference lesion is a FN if its largest IoU with a predicted lesion it touches is < the threshold;
  F1 = TP / (TP + (FP + FN) / 2). Empty case: no lesion on either side -> 1. The function's default threshold
  in ``metrics.py`` is 0.25; their evaluation script (``test.py``) passes 0.5, which is mcseg's default.

**QU-BraTS** (Mehta et al., MELBA 2022; github RagMeh11/QU-BraTS, commit f174e55, ``BraTS_Seg_Uncertainty.py``),
per region with an uncertainty map u in [0, 100] (0 = certain):

* thresholds tau = 100, 100 - 100/n, ..., 0 (n = 40 points: 41 values; the authors' ``arange(0, 100 + EPS,
  100 / n)`` reversed, as NumPy 1.x evaluated it in 2020; here ``linspace``, equal for n = 40). Under NumPy 2
  the same code loses tau = 100 (its float32 EPS keeps the stop at 100.0), and its AUCs change; mcseg follows
  the challenge's; a voxel is retained when u <= tau;
* Dice of the retained voxels (prediction and reference both multiplied by the retained mask, over the whole
  grid; both empty -> 1); FTP(tau) = (TP - TP_retained) / (TP + eps) and FTN likewise with the true negatives,
  both inside the brain mask (eps = float32's machine epsilon: no TP gives 0);
* AUC = trapezoidal area over tau / 100 (sklearn ``auc`` on the decreasing thresholds, as the authors);
* the combined score of a region = (AUC_Dice + (1 - AUC_FTP) + (1 - AUC_FTN)) / 3 (the paper's score; their
  code stops at the three AUCs; third-party code of 2020, monte_carlo_analysis's BRATSMetric, combines them so).

**CURVAS-PDACVI 2025** (SYCAI-Technologies/curvas-challenge, commit 86cfbeb, ``CURVAS-PDACVI_2025/
evaluation_metrics/metrics_evaluation.py``, ``merged_dice_score``; ../shared/reference/multirater_and_interop.md
A2): :func:`curvas_thresholded_dice` is mcseg's thresholded Dice (:func:`mcseg.metrics.raters.thresholded_dice`)
of the foreground probability against the rater mean with the code's thresholds linspace(0.1, 0.8, 6) =
{0.10, 0.24, 0.38, 0.52, 0.66, 0.80} (the page's "0.1 to 0.8"; not 0.1, 0.2, ..., 0.8), strict comparisons
p > t and mean > t, the mean of the six Dices. Empty case: both thresholded masks empty at a threshold -> 1 at
that threshold (the code's policy); the Dice's denominator has the code's 1e-6 added (:data:`CURVAS_DICE_EPS`).
:func:`curvas_class_dice` scores every foreground class c of a softmax task so, with the masks [y_r = c] as
the raters' (the challenge's task is binary: PDAC; for a binary task the two are the same value).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mcseg.metrics.raters import thresholded_dice

__all__ = ["NDSC_R", "SHIFTS_FRACTIONS", "normalised_dice", "ndsc_retention_curve", "ndsc_aac", "lesion_f1",
           "CURVAS_DICE_EPS", "curvas_class_dice", "curvas_thresholded_dice", "QUBRATS_POINTS", "QuBratsCurves", "qubrats_curves", "uncertainty_0_100"]

NDSC_R = 0.001
SHIFTS_FRACTIONS = np.log(np.arange(1, 201)) / np.log(200)
QUBRATS_POINTS = 40
_F32_EPS = float(np.finfo(np.float32).eps)


def _flat_bool(x, name: str) -> np.ndarray:
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.dtype != bool and not np.isin(a, (0, 1)).all():
        raise ValueError(f"{name}: expected a binary mask (0/1 or bool), found values {np.unique(a)[:5].tolist()}")
    return a.astype(bool).reshape(-1)


def _flat_float(x, name: str, size: int) -> np.ndarray:
    a = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).astype(np.float64).reshape(-1)
    if a.size != size:
        raise ValueError(f"{name}: {a.size} voxels, the masks have {size}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: expected finite values")
    return a


def _ndsc(tp, fp, fn, n_pred, n_ref, n_voxels, r: float = NDSC_R):
    """nDSC from counts (arrays broadcast): the module docstring's formula and empty-case policy."""
    tp, fp, fn, n_pred = (np.asarray(v, dtype=np.float64) for v in (tp, fp, fn, n_pred))
    if n_ref == 0:
        k = 1.0
    elif n_voxels == n_ref:
        k = math.inf
    else:
        k = (1 - r) * n_ref / (r * (n_voxels - n_ref))
    with np.errstate(invalid="ignore"):
        scaled = np.where(fp > 0, k * fp, 0.0)
    denominator = scaled + 2 * tp + fn
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(denominator > 0, 2 * tp / denominator, 0.0)
    return np.where(n_pred + n_ref == 0, 1.0, value)


def normalised_dice(prediction, reference, r: float = NDSC_R) -> float:
    """nDSC of two binary masks of the same shape (module docstring; Shifts ``dice_norm_metric``)."""
    p, g = _flat_bool(prediction, "prediction"), _flat_bool(reference, "reference")
    if p.shape != g.shape:
        raise ValueError(f"prediction ({p.size} voxels) and reference ({g.size}) differ")
    tp = int(np.count_nonzero(p & g))
    return float(_ndsc(tp, int(np.count_nonzero(p & ~g)), int(np.count_nonzero(~p & g)), int(p.sum()),
                       int(g.sum()), g.size, r))


def ndsc_retention_curve(prediction, reference, uncertainty, fractions=SHIFTS_FRACTIONS,
                         r: float = NDSC_R) -> np.ndarray:
    """nDSC at each retained fraction (module docstring; Shifts ``ndsc_retention_curve``): ``len(fractions)``
    values. The masks and the uncertainty map are the voxels scored (the authors pass the brain mask's)."""
    p, g = _flat_bool(prediction, "prediction"), _flat_bool(reference, "reference")
    u = _flat_float(uncertainty, "uncertainty", g.size)
    if p.shape != g.shape:
        raise ValueError(f"prediction ({p.size} voxels) and reference ({g.size}) differ")
    fractions = np.asarray(fractions, dtype=np.float64)
    if fractions.ndim != 1 or not ((fractions >= 0) & (fractions <= 1)).all():
        raise ValueError(f"fractions: expected a 1D array of values in [0, 1], got {fractions}")
    order = np.argsort(u)
    p, g = p[order], g[order]
    n = g.size

    def before(x):  # counts over the first `pos` voxels, for pos = 0..n
        return np.concatenate(([0], np.cumsum(x, dtype=np.int64)))

    tp, fp, fn, kept_pred, kept_ref = before(p & g), before(p & ~g), before(~p & g), before(p), before(g)
    pos = (n * fractions).astype(np.int64)  # int(N f), as the authors
    n_ref = int(g.sum())
    replaced_ref = n_ref - kept_ref[pos]  # the replaced voxels are the reference: each of its voxels a TP
    return _ndsc(tp[pos] + replaced_ref, fp[pos], fn[pos], kept_pred[pos] + replaced_ref, n_ref, n, r)


def ndsc_aac(prediction, reference, uncertainty, fractions=SHIFTS_FRACTIONS, r: float = NDSC_R) -> float:
    """1 - the trapezoidal area under the nDSC retention curve (Shifts ``ndsc_aac_metric``; lower is better)."""
    curve = ndsc_retention_curve(prediction, reference, uncertainty, fractions, r)
    return float(1.0 - np.trapezoid(curve, np.asarray(fractions, dtype=np.float64)))


def lesion_f1(prediction, reference, iou_threshold: float = 0.5) -> float:
    """Lesion-scale F1 (module docstring; Shifts ``lesion_f1_score``), from the sparse contingency table of the
    predicted and reference connected components (the pairs that overlap)."""
    from scipy import ndimage

    if not 0.0 <= iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold={iou_threshold}: expected a value in [0, 1]")
    p, g = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
            for x in (prediction, reference))
    if p.shape != g.shape:
        raise ValueError(f"prediction {p.shape} and reference {g.shape} differ")
    lp, n_p = ndimage.label(_flat_bool(p, "prediction").reshape(p.shape))
    lg, n_g = ndimage.label(_flat_bool(g, "reference").reshape(g.shape))
    if n_p + n_g == 0:
        return 1.0
    lp, lg = lp.reshape(-1).astype(np.int64), lg.reshape(-1).astype(np.int64)
    both = (lp > 0) & (lg > 0)  # the overlapping pairs only: a sparse contingency table
    pairs, inter = np.unique(lp[both] * (n_g + 1) + lg[both], return_counts=True)
    i, j = pairs // (n_g + 1), pairs % (n_g + 1)
    size_p, size_g = np.bincount(lp, minlength=n_p + 1), np.bincount(lg, minlength=n_g + 1)
    iou = inter / (size_p[i] + size_g[j] - inter)
    best_p, best_g = np.zeros(n_p + 1), np.zeros(n_g + 1)  # lesions touching nothing: IoU 0
    np.maximum.at(best_p, i, iou)
    np.maximum.at(best_g, j, iou)
    best_p, best_g = best_p[1:], best_g[1:]
    tp = int((best_p >= iou_threshold).sum())
    fp, fn = n_p - tp, int((best_g < iou_threshold).sum())
    return tp / (tp + 0.5 * (fp + fn))


#: what CURVAS-PDACVI's ``merged_dice_score`` adds to the denominator of its Dice (its ``smooth``)
CURVAS_DICE_EPS = 1e-6


def curvas_class_dice(probs: torch.Tensor, raters: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``C`` CURVAS-PDACVI thresholded Dices, one per foreground class (index 0 NaN; module docstring) of
    softmax probabilities ``C x *S`` against ``K x *S`` rater label maps."""
    return thresholded_dice(probs, raters, num_classes, "curvas2025", eps=CURVAS_DICE_EPS)


def curvas_thresholded_dice(probability, raters) -> float:
    """CURVAS-PDACVI's thresholded Dice (module docstring) of a foreground probability map ``*S`` against
    ``K x *S`` binary rater masks."""
    p = torch.as_tensor(probability).double()
    r = torch.as_tensor(raters).long()
    if tuple(r.shape[1:]) != tuple(p.shape):
        raise ValueError(f"raters {tuple(r.shape)}: expected K x {tuple(p.shape)} binary masks")
    return float(curvas_class_dice(torch.stack([1 - p, p]), r, 2)[1])


@dataclass(frozen=True)
class QuBratsCurves:
    """One region's QU-BraTS curves over ``thresholds`` (decreasing, 100 -> 0) and their areas."""

    thresholds: np.ndarray
    dice: np.ndarray
    ftp: np.ndarray
    ftn: np.ndarray

    def auc(self, curve: np.ndarray) -> float:
        return float(np.trapezoid(curve[::-1], self.thresholds[::-1]) / 100.0)

    @property
    def dice_auc(self) -> float:
        return self.auc(self.dice)

    @property
    def ftp_auc(self) -> float:
        return self.auc(self.ftp)

    @property
    def ftn_auc(self) -> float:
        return self.auc(self.ftn)

    @property
    def score(self) -> float:
        """(AUC_Dice + (1 - AUC_FTP) + (1 - AUC_FTN)) / 3 (higher is better)."""
        return (self.dice_auc + (1.0 - self.ftp_auc) + (1.0 - self.ftn_auc)) / 3.0


def qubrats_curves(prediction, reference, uncertainty, brain_mask=None,
                   n_points: int = QUBRATS_POINTS) -> QuBratsCurves:
    """A region's Dice, FTP and FTN over the uncertainty thresholds (module docstring; QU-BraTS ``make``).
    ``uncertainty`` in [0, 100]; ``brain_mask`` None = every voxel."""
    p, g = _flat_bool(prediction, "prediction"), _flat_bool(reference, "reference")
    if p.shape != g.shape:
        raise ValueError(f"prediction ({p.size} voxels) and reference ({g.size}) differ")
    u = _flat_float(uncertainty, "uncertainty", g.size)
    if u.size and (u.min() < 0 or u.max() > 100):
        raise ValueError(f"uncertainty: expected values in [0, 100], found [{u.min():g}, {u.max():g}]")
    if n_points < 1:
        raise ValueError(f"n_points={n_points}: expected at least 1")
    brain = np.ones_like(g) if brain_mask is None else _flat_bool(brain_mask, "brain_mask")
    thresholds = np.linspace(0.0, 100.0, n_points + 1)[::-1]

    def retained(mask):  # voxels of `mask` with u <= tau, per threshold
        return np.searchsorted(np.sort(u[mask]), thresholds, side="right").astype(np.float64)

    tp_r, pred_r, ref_r = retained(p & g), retained(p), retained(g)
    total = pred_r + ref_r
    dice = np.where(total > 0, 2 * tp_r / np.where(total > 0, total, 1.0), 1.0)
    tp_mask, tn_mask = p & g & brain, ~p & ~g & brain
    tp, tn = float(tp_mask.sum()), float(tn_mask.sum())
    ftp = (tp - retained(tp_mask)) / (tp + _F32_EPS)
    ftn = (tn - retained(tn_mask)) / (tn + _F32_EPS)
    return QuBratsCurves(thresholds, dice, ftp, ftn)


def uncertainty_0_100(probability) -> torch.Tensor:
    """mcseg's uncertainty map for the curves above: the binary entropy of p in bits, times 100 (0 where p is
    0 or 1, 100 at p = 1/2)."""
    p = torch.as_tensor(probability).double()
    h = -(torch.xlogy(p, p) + torch.xlogy(1 - p, 1 - p)) / math.log(2)
    return (100.0 * h).clamp(0.0, 100.0)

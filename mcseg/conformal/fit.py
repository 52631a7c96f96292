"""One threshold and one pair of margins per class, fitted on the calibration cases' summaries, and applied to a
new case: the sets a case gets (:func:`case_sets`) and what they achieve against its ground truth (:func:`case_test`).

A calibration case is summarised once (:func:`summarise`): its per-class counts on the threshold grid
(:func:`mcseg.conformal.risks.case_counts`) and its outer and inner margin scores
(:mod:`mcseg.conformal.margins`); no voxel is kept, so fits over many random splits reuse the summaries.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mcseg.conformal.control import control
from mcseg.conformal.margins import conformal_quantile, grown, inner_score, outer_score, shrunk
from mcseg.conformal.risks import LOSSES, CaseCounts, case_counts, class_masks, loss_table

__all__ = ["CaseSummary", "ConformalSettings", "case_sets", "class_indices", "case_test", "fit_margins",
           "fit_thresholds",
           "predicted_masks", "summarise"]


@dataclass
class ConformalSettings:
    """What is controlled and how: ``loss`` (fnr, fdr) by ``method`` (crc, rcps, ltt) at level ``alpha`` (and
    failure probability ``delta``); cases without a class by ``absent``; margins at coverage ratio ``tau``;
    ``classes``: the channels that get a threshold and margins. The threshold grid is the summaries' own."""

    alpha: float = 0.1
    delta: float | None = None
    method: str = "crc"
    loss: str = "fnr"
    absent: str = "skip"
    rcps_bound: str = "wsr"
    fwer: str = "bonferroni_holm"
    tau: float = 1.0
    classes: Sequence[int] = ()


def class_indices(names: Sequence[str] | None, class_names: Sequence[str], multilabel: bool) -> list[int]:
    """The channels of ``names`` (default: every class but the background; every region of a region model)."""
    if not names:
        return list(range(len(class_names))) if multilabel else list(range(1, len(class_names)))
    unknown = [c for c in names if c not in class_names]
    if unknown:
        raise ValueError(f"{' '.join(unknown)}: the task's classes are {', '.join(class_names)}")
    return [list(class_names).index(c) for c in names]


@dataclass
class CaseSummary:
    """Calibration cases, summarised: their names, counts on the threshold grid ``thresholds``, ``C x 2``
    (outer, inner) margins in mm and the ``C`` voxel counts of the predicted structures (the reference of a set's
    volume); one case (:func:`summarise`) or n stacked on a leading axis (:meth:`stack`, :meth:`take`,
    :meth:`join`)."""

    cases: list[str]
    thresholds: np.ndarray
    counts: CaseCounts
    margins: np.ndarray
    predicted: np.ndarray

    @staticmethod
    def stack(summaries: Sequence[CaseSummary]) -> CaseSummary:
        grid = summaries[0].thresholds
        if any(not np.array_equal(s.thresholds, grid) for s in summaries):
            raise ValueError("case summaries on different threshold grids cannot be stacked")
        return CaseSummary([c for s in summaries for c in s.cases], grid,
                           CaseCounts.stack([s.counts for s in summaries]), np.stack([s.margins for s in summaries]),
                           np.stack([s.predicted for s in summaries]))

    @staticmethod
    def join(parts: Sequence[CaseSummary]) -> CaseSummary:
        """Stacked summaries one after another (e.g. calibration and test cases pooled)."""
        grid = parts[0].thresholds
        if any(not np.array_equal(p.thresholds, grid) for p in parts):
            raise ValueError("case summaries on different threshold grids cannot be joined")
        counts = CaseCounts(*(np.concatenate([getattr(p.counts, f) for p in parts])
                              for f in ("positives", "selected", "hits")))
        return CaseSummary([c for p in parts for c in p.cases], grid, counts,
                           np.concatenate([p.margins for p in parts]), np.concatenate([p.predicted for p in parts]))

    def take(self, cases: np.ndarray) -> CaseSummary:
        """The stacked summaries of ``cases`` (indices)."""
        return CaseSummary([self.cases[i] for i in cases], self.thresholds, self.counts.take(cases),
                           self.margins[cases], self.predicted[cases])

    def __len__(self) -> int:
        return len(self.cases)


def predicted_masks(probs: torch.Tensor, multilabel: bool, prediction: torch.Tensor | None = None) -> np.ndarray:
    """``C x *S`` boolean predicted structures: the tool's label map when given, else the arg-max (softmax) or
    p > 0.5 (regions), as the evaluator scores them."""
    if prediction is not None:
        return class_masks(prediction, probs.shape[0], multilabel).numpy()
    if multilabel:
        return (probs > 0.5).numpy()
    return class_masks(probs.argmax(0), probs.shape[0], False).numpy()


def summarise(case: str, probs: torch.Tensor, truth: torch.Tensor, pred: np.ndarray, spacing: Sequence[float],
              thresholds: torch.Tensor, tau: float = 1.0, classes: Sequence[int] | None = None) -> CaseSummary:
    """One case's counts on ``thresholds`` and margins of ``classes`` (others: NaN); ``truth`` and ``pred`` are
    ``C x *S`` booleans."""
    classes = range(probs.shape[0]) if classes is None else classes
    truth_np = truth.numpy()
    margins = np.full((probs.shape[0], 2), np.nan)
    for k in classes:
        margins[k] = outer_score(pred[k], truth_np[k], spacing, tau), inner_score(pred[k], truth_np[k], spacing)
    return CaseSummary([case], np.asarray(thresholds, np.float64), case_counts(probs, truth, thresholds), margins,
                       pred.reshape(pred.shape[0], -1).sum(1))


def fit_thresholds(summaries: CaseSummary, settings: ConformalSettings) -> dict[int, dict]:
    """Per class of ``settings.classes``: the threshold, its calibration risk and bound, n and the cases without
    the class (under ``absent="skip"`` left out of n)."""
    fits = {}
    for k in settings.classes:
        table, without = loss_table(summaries.counts, k, settings.loss, settings.absent)
        if not len(table):
            raise ValueError(f"class channel {k}: none of the {len(summaries)} calibration cases contains it, so no "
                             f"threshold can be fitted under absent='skip'; leave the class out, or count such cases "
                             f"with loss 0 (absent='zero')")
        fit = control(table, summaries.thresholds, settings.loss, settings.method, settings.alpha, settings.delta,
                      settings.rcps_bound, settings.fwer)
        fits[k] = {**fit.record(), "cases_without_class": [summaries.cases[i] for i in without]}
    return fits


def fit_margins(summaries: CaseSummary, settings: ConformalSettings) -> dict[int, dict]:
    """Per class: the conformal quantiles at 1 - alpha of the outer and inner margins (mm) over the cases that
    contain the class (a case without it has nothing to cover; n counts the others)."""
    fits = {}
    for k in settings.classes:
        present = summaries.counts.positives[:, k] > 0
        kept = summaries.margins[present, k]
        without = [c for c, p in zip(summaries.cases, present) if not p]
        fits[k] = {"outer_mm": conformal_quantile(kept[:, 0], settings.alpha),
                   "inner_mm": conformal_quantile(kept[:, 1], settings.alpha),
                   "n_cases": len(kept), "tau": settings.tau, "cases_without_class": without}
    return fits


def case_sets(probs: torch.Tensor, pred: np.ndarray, spacing: Sequence[float], thresholds: dict[int, dict],
              margins: dict[int, dict]) -> dict[int, dict[str, np.ndarray]]:
    """Per class: the thresholded ``set`` {p_k >= t_k}, the ``possible`` (grown) and ``sure`` (shrunk) masks."""
    out = {}
    for k, fit in thresholds.items():
        out[k] = {"set": (probs[k].double() >= fit["threshold"]).numpy(),
                  "possible": grown(pred[k], spacing, margins[k]["outer_mm"]),
                  "sure": shrunk(pred[k], spacing, margins[k]["inner_mm"])}
    return out


def case_test(sets: dict[int, dict[str, np.ndarray]], truth: np.ndarray, pred: np.ndarray, loss: str,
              tau: float = 1.0) -> dict[int, dict]:
    """What a case's sets achieve against its ground truth, per class: the loss of the set (NaN for the FNR of a
    case without the class), the set's and the grown mask's volume relative to the prediction, whether the grown
    mask covers >= tau of the truth and the shrunk one lies inside it."""
    rows = {}
    for k, masks in sets.items():
        g, s = truth[k].astype(bool), masks["set"]
        predicted = int(pred[k].sum())
        per_prediction = (lambda voxels: float(voxels / predicted)) if predicted else (lambda voxels: float("nan"))
        entry = LOSSES[loss]
        value = (float(entry.of_counts((s & g).sum(), s.sum(), g.sum())) if g.any() or not entry.needs_class
                 else float("nan"))
        rows[k] = {"loss": value, "present": bool(g.any()),
                   "set_voxels": int(s.sum()), "predicted_voxels": predicted,
                   "set_over_prediction": per_prediction(s.sum()),
                   "possible_over_prediction": per_prediction(masks["possible"].sum()),
                   "covered": bool(not g.any() or (masks["possible"] & g).sum() / g.sum() >= tau),
                   "sure_inside": bool(not (masks["sure"] & ~g).any())}
    return rows

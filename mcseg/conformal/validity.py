"""The guarantees checked, not assumed: fit on the calibration cases of a split, measure on its test cases, repeat
over many random calibration / test splits of the cases (../shared/reference/posthoc_and_conformal.md, B8).

Per class and split: the test risk (mean loss of the test cases at the fitted threshold; CRC promises its
expectation <= alpha, RCPS and LTT that it exceeds alpha in at most a fraction delta of the splits), what the
guarantee costs (the mean over test cases of the set's volume over the predicted structure's), and the
fractions of test cases whose grown mask covers the truth and whose shrunk mask lies inside it (each >= 1 - alpha
in expectation). Re-splitting one finite pool gives dependent repeats: the spread printed is the Monte-Carlo
standard error of the repeats, a sanity check rather than an exact test.
"""
from __future__ import annotations

import numpy as np

from mcseg.conformal.fit import CaseSummary, ConformalSettings, fit_margins, fit_thresholds
from mcseg.conformal.risks import loss_table

__all__ = ["over_splits", "split_once", "summarise_splits", "validity_rows"]


def split_once(calibration: CaseSummary, test: CaseSummary, settings: ConformalSettings) -> dict[int, dict]:
    """Per class: the fitted threshold and margins on ``calibration`` and what they give on ``test``."""
    thresholds = fit_thresholds(calibration, settings)
    margins = fit_margins(calibration, settings)
    rows = {}
    for k in settings.classes:
        table, _ = loss_table(test.counts, k, settings.loss, settings.absent)
        present = test.margins[test.counts.positives[:, k] > 0, k]
        index, predicted = thresholds[k]["index"], test.predicted[:, k]
        stretch = test.counts.selected[predicted > 0, k, index] / predicted[predicted > 0]
        rows[k] = {"threshold": thresholds[k]["threshold"], "controlled": thresholds[k]["controlled"],
                   "test_risk": float(table[:, index].mean()) if len(table) else float("nan"),
                   "set_over_prediction": float(stretch.mean()) if len(stretch) else float("nan"),
                   "outer_mm": margins[k]["outer_mm"], "inner_mm": margins[k]["inner_mm"],
                   "covered": _fraction(present[:, 0] <= margins[k]["outer_mm"]),
                   "sure_inside": _fraction(present[:, 1] <= margins[k]["inner_mm"])}
    return rows


def _fraction(hits: np.ndarray) -> float:
    return float(hits.mean()) if len(hits) else float("nan")


def over_splits(summaries: CaseSummary, settings: ConformalSettings, n_calibration: int,
                repeats: int = 200, seed: int = 0) -> dict[int, list[dict]]:
    """:func:`split_once` over ``repeats`` random splits (``n_calibration`` cases to calibrate, the others to
    test); per class the list of split rows."""
    if not 0 < n_calibration < len(summaries):
        raise ValueError(f"{n_calibration} calibration cases of {len(summaries)}: leave at least one to test")
    rng = np.random.default_rng(seed)
    out: dict[int, list[dict]] = {k: [] for k in settings.classes}
    for _ in range(repeats):
        order = rng.permutation(len(summaries))
        rows = split_once(summaries.take(order[:n_calibration]), summaries.take(order[n_calibration:]), settings)
        for k, row in rows.items():
            out[k].append(row)
    return out


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), se


def summarise_splits(rows: list[dict], alpha: float) -> dict:
    """Mean test risk and its standard error over the splits, the violation rate (test risk > alpha) and its
    standard error, the mean threshold, and the margins' mean coverage."""
    risk = np.array([r["test_risk"] for r in rows], np.float64)
    finite = risk[np.isfinite(risk)]
    violated = (finite > alpha).astype(np.float64)
    out = {"splits": len(rows)}
    out["mean_test_risk"], out["mean_test_risk_se"] = _mean_se(risk)
    out["violation_rate"], out["violation_rate_se"] = _mean_se(violated)
    out["mean_threshold"] = float(np.mean([r["threshold"] for r in rows]))
    out["uncontrolled_splits"] = int(sum(not r["controlled"] for r in rows))
    for key in ("set_over_prediction", "covered", "sure_inside", "outer_mm", "inner_mm"):
        out[f"mean_{key}"], out[f"mean_{key}_se"] = _mean_se(np.array([r[key] for r in rows], np.float64))
    return out


def validity_rows(summaries: CaseSummary, settings: ConformalSettings, class_names: list[str], n_calibration: int,
                  repeats: int = 200, seed: int = 0) -> list[dict]:
    """One table row per class: the settings, n calibration / test cases, and :func:`summarise_splits` of
    :func:`over_splits`."""
    rows = []
    for k, split_rows in over_splits(summaries, settings, n_calibration, repeats, seed).items():
        rows.append({"class": class_names[k], "method": settings.method, "loss": settings.loss,
                     "alpha": settings.alpha, "delta": settings.delta, "absent": settings.absent,
                     "n_calibration": n_calibration, "n_test": len(summaries) - n_calibration, "seed": seed,
                     **summarise_splits(split_rows, settings.alpha)})
    return rows

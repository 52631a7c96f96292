"""The guarantees checked, not assumed: fit on the calibration cases of a split, measure on its test cases, repeat
over many random calibration / test splits of the cases (../shared/reference/posthoc_and_conformal.md, B8).

Per class and split: the test risk (mean loss of the test cases at the fitted threshold; CRC promises its
expectation <= alpha, RCPS and LTT that it exceeds alpha in at most a fraction delta of the splits), what the
guarantee costs (the mean over test cases of the set's volume over the predicted structure's), and the
fractions of test cases whose grown mask covers the truth and whose shrunk mask lies inside it (each >= 1 - alpha
in expectation). Re-splitting one finite pool gives dependent repeats: the spread printed is the Monte-Carlo
standard error of the repeats, a sanity check rather than an exact test.

:func:`pooled_splits` is what a checkpoint's evaluation (``conformal.repeats``) and ``mcseg-conformal-folder``
(``--repeats``) add to a fit applied to labelled test cases: its calibration and test cases pooled and re-split
at several alphas, written beside conformal.json (``validity.csv``, ``coverage.png``) and summarised in it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from mcseg.conformal.config import ALPHAS, REPEATS
from mcseg.conformal.fit import CaseSummary, ConformalSettings, fit_margins, fit_thresholds
from mcseg.conformal.risks import loss_table

__all__ = ["ALPHAS", "COVERAGE_FIGURE", "POOLED", "REPEATS", "VALIDITY_FILE", "coverage_title", "levels",
           "over_alphas", "over_splits", "pooled_splits", "split_once", "summarise_splits", "validity_rows"]

VALIDITY_FILE, COVERAGE_FIGURE = "validity.csv", "coverage.png"
POOLED = ("the calibration and the test cases pooled and split again at random, repeats times, into as many "
          "calibration cases as the fit had and the others to test (per class and alpha, over the splits: the mean "
          "test risk and the violation rate, test risk > alpha, each with its Monte-Carlo standard error). Splits of "
          "one finite pool are dependent repeats: their spread is a sanity check, not an exact test. The guarantee "
          "itself is the fixed split's: fitted on the calibration cases, applied to the test cases (classes, test)")


def split_once(calibration: CaseSummary, test: CaseSummary, settings: ConformalSettings) -> dict[int, dict]:
    """Per class: the fitted threshold and margins on ``calibration`` and what they give on ``test``. A class
    that no calibration case holds under ``absent="skip"`` (a random split of a pool where it is rare) has no
    threshold: its row is not controlled, with NaN figures."""
    fitted = [k for k in settings.classes if len(loss_table(calibration.counts, k, settings.loss, settings.absent)[0])]
    thresholds = fit_thresholds(calibration, replace(settings, classes=fitted))
    margins = fit_margins(calibration, settings)
    rows = {}
    for k in settings.classes:
        if k not in thresholds:
            rows[k] = {"threshold": math.nan, "controlled": False, "test_risk": math.nan,
                       "set_over_prediction": math.nan, "outer_mm": margins[k]["outer_mm"],
                       "inner_mm": margins[k]["inner_mm"], "covered": math.nan, "sure_inside": math.nan}
            continue
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
    out["mean_threshold"] = _mean_se(np.array([r["threshold"] for r in rows], np.float64))[0]
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


def over_alphas(summaries: CaseSummary, settings: ConformalSettings, class_names: list[str],
                alphas: Sequence[float], n_calibration: int, repeats: int = 200, seed: int = 0) -> list[dict]:
    """:func:`validity_rows` at each of ``alphas`` (the other settings as they are), the same splits for each."""
    rows = []
    for alpha in alphas:
        rows += validity_rows(summaries, replace(settings, alpha=alpha), class_names, n_calibration, repeats, seed)
    return rows


def levels(alphas: Sequence[float], alpha: float) -> list[float]:
    """The alphas of the re-splits: ``alphas`` and the fit's own ``alpha``, ascending."""
    return sorted({*map(float, alphas), float(alpha)})


def coverage_title(settings: ConformalSettings, n_cases: int, n_calibration: int, repeats: int) -> str:
    return (f"{settings.method.upper()} of the {settings.loss.upper()}, {n_cases} cases, {n_calibration} to "
            f"calibrate, {repeats} splits")


def pooled_splits(calibration: CaseSummary, test: CaseSummary, settings: ConformalSettings, class_names: list[str],
                  alphas: Sequence[float], repeats: int, folder: Path, seed: int = 0):
    """``calibration`` and ``test`` pooled (:data:`POOLED`), :func:`over_alphas` with as many calibration cases as
    ``calibration``; writes ``folder/validity.csv`` and the figure ``folder/coverage.png``
    (:func:`mcseg.conformal.plots.coverage_figure`). Returns conformal.json's ``validity`` block and the figure."""
    from mcseg.conformal.plots import coverage_figure
    from mcseg.conformal.record import finite
    from mcseg.files import atomic_write, write_csv

    pool = CaseSummary.join([calibration, test])
    rows = over_alphas(pool, settings, class_names, alphas, len(calibration), repeats, seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / VALIDITY_FILE, rows)
    figure = coverage_figure(rows, coverage_title(settings, len(pool), len(calibration), repeats))
    atomic_write(folder / COVERAGE_FIGURE, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    settings_keys = {"method", "loss", "delta", "absent", "n_calibration", "n_test", "seed", "splits"}
    block = {"what": POOLED, "n_cases": len(pool), "n_calibration": len(calibration), "n_test": len(test),
             "repeats": repeats, "seed": seed, "alphas": [float(a) for a in alphas],
             "files": [VALIDITY_FILE, COVERAGE_FIGURE],
             "rows": [{key: finite(value) if isinstance(value, float) else value for key, value in row.items()
                       if key not in settings_keys} for row in rows]}
    return block, figure

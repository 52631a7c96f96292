"""The statements' guarantees checked over random calibration / test splits of labelled cases (as
:mod:`mcseg.conformal.validity` does for the conformal sets): the labelled cases pooled, ``repeats`` random splits
into n calibration and the rest as test cases (seeded, each split drawn afresh), every statement fitted on the
calibration part and measured on the test part.

Per split, level and structure: the coverage of each statement on the test cases (the share of test cases whose
truth lies inside) and the mean width (volume intervals in mL, beside the mean true volume); per split and level
the review rule's failure rate among the accepted test cases, whether it exceeds alpha, and the share flagged.
Read as: the mean coverage over splits estimates P(covered) >= 1 - alpha (the guarantee is on average over draws
of calibration and test cases, not per split); the review rule's guarantee is P(R(s) <= alpha) >= 1 - delta, so
its violation rate over splits (with finite test sets, a noisy estimate of R(s)) is compared with delta. The
splits are dependent repeats of one pool, not independent data sets.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mcseg.statements.intervals import STATEMENTS, available, bounds, covered, quantiles
from mcseg.statements.review import failures, fit_review, risk_scores
from mcseg.statements.table import CaseTable

__all__ = ["rank_correlations", "split_rows", "summarise_rows"]


def _split(table: CaseTable, rng: np.random.Generator, n_calibration: int) -> tuple[CaseTable, CaseTable]:
    order = rng.permutation(len(table))
    return table.take(order[:n_calibration]), table.take(order[n_calibration:])


def split_rows(table: CaseTable, n_calibration: int, alphas: Sequence[float], repeats: int = 200, seed: int = 0,
               delta: float = 0.1, floor: float = 0.7) -> list[dict]:
    """One row per split, level, statement and structure (``statement`` "review": one per split and level)."""
    if not table.labelled:
        raise ValueError("validity needs labelled cases")
    if not 0 < n_calibration < len(table):
        raise ValueError(f"{n_calibration} calibration cases of {len(table)}: leave some to test")
    rng = np.random.default_rng(seed)
    rows = []
    for repeat in range(repeats):
        calibration, test = _split(table, rng, n_calibration)
        for alpha in alphas:
            for name in available(table):
                lower, upper = bounds(test.unlabelled(), name, quantiles(calibration, name, alpha))
                hit = covered(test, name, lower, upper)
                width = upper - lower
                for k, structure in enumerate(table.structures):
                    rows.append({"split": repeat, "alpha": alpha, "statement": name, "structure": structure,
                                 "coverage": float(hit[:, k].mean()),
                                 "mean_width": float(np.mean(width[:, k])),
                                 "mean_true": float(test.figures[STATEMENTS[name].truth][:, k].mean())})
            rule = fit_review(risk_scores(calibration.figures["soft_dice"]),
                              failures(calibration.figures["dice_true"], floor), alpha, delta, floor)
            flagged = rule.flags(risk_scores(test.figures["soft_dice"]))
            failed = failures(test.figures["dice_true"], floor)
            accepted = ~flagged
            rate = float(failed[accepted].mean()) if accepted.any() else 0.0
            rows.append({"split": repeat, "alpha": alpha, "statement": "review", "structure": "",
                         "coverage": float(rate <= alpha), "mean_width": float(flagged.mean()), "mean_true": rate,
                         "certified": rule.certified})
    return rows


def summarise_rows(rows: list[dict]) -> list[dict]:
    """Per level, statement and structure: mean coverage +- its standard error over the splits and the share of
    splits below 1 - alpha; the mean width and true value (the review: the violation rate, the share flagged and
    the mean failure rate among the accepted)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["alpha"], row["statement"], row["structure"]), []).append(row)
    out = []
    for (alpha, name, structure), group in groups.items():
        cover = np.array([r["coverage"] for r in group])
        entry = {"alpha": alpha, "statement": name, "structure": structure, "splits": len(group)}
        if name == "review":
            entry.update(violation_rate=float(1 - cover.mean()),
                         certified_share=float(np.mean([r["certified"] for r in group])),
                         flagged_share=float(np.mean([r["mean_width"] for r in group])),
                         failure_rate_accepted=float(np.mean([r["mean_true"] for r in group])))
        else:
            finite = [r["mean_width"] for r in group if np.isfinite(r["mean_width"])]
            entry.update(mean_coverage=float(cover.mean()),
                         se=float(cover.std(ddof=1) / np.sqrt(len(cover))) if len(cover) > 1 else float("nan"),
                         splits_below_level=float(np.mean(cover < 1 - alpha)),
                         mean_width=float(np.mean(finite)) if finite else float("inf"),
                         infinite_share=float(1 - len(finite) / len(group)),
                         mean_true=float(np.mean([r["mean_true"] for r in group])))
        out.append(entry)
    return out


def rank_correlations(table: CaseTable) -> list[dict]:
    """Per structure, Spearman's rank correlation of the true Dice with each label-free figure (signed so that
    higher = a better case expected): the soft self-Dice against the plain aggregates."""
    from scipy.stats import spearmanr  # scipy.stats: seconds to import

    f = table.figures
    candidates = {"soft_dice": f["soft_dice"], "minus_band_mm": -f["band_mm"],
                  "minus_relative_sd": -f["volume_sd_ml"] / (f["volume_expected_ml"] + f["voxel_ml"]),
                  "volume_mask_ml": f["volume_mask_ml"]}
    out = []
    for k, structure in enumerate(table.structures):
        for name, values in candidates.items():
            rho = spearmanr(values[:, k], f["dice_true"][:, k]).statistic
            out.append({"structure": structure, "figure": name, "spearman_with_true_dice": float(rho)})
    return out

"""The plain and the weighted statements under shift over random calibration draws (Tibshirani, Barber, Candes,
Ramdas 2019; ../shared/reference/new_case_statements.md, C4): what :mod:`~mcseg.statements.validity` does for
exchangeable cases, for new cases taken from shifted conditions (e.g. corrupted versions of test cases).

The labelled clean cases are pooled (a run's validation and test cases); each draw takes ``n_calibration`` of
them at random as the calibration cases, and the new cases of every condition are that condition's versions of
the pooled cases NOT drawn (a case, or a corrupted copy of it, never both calibrates and is stated about). Per
draw, condition, statement and structure: the plain statement's coverage of the condition's new cases, the
weighted one's (density-ratio weights cross-fitted between the draw's calibration cases and the condition's new
cases on the label-free case features, :mod:`~mcseg.statements.shift`, seeded by the draw), the weighted
statements' share of infinite bounds, the median finite width of each, and the effective sample size of the
calibration weights.

Read as: the mean coverage over draws estimates P(covered), the probability the guarantee is about; the weighted
guarantee holds for the true density ratio, on average over the draws of the cases (not per draw, not per case),
and the weights here are estimates. Draws are dependent repeats of one pool, not independent data sets.
"""
from __future__ import annotations

import numpy as np

from mcseg.statements.intervals import available, bounds, covered, quantiles
from mcseg.statements.quantiles import effective_sample_size
from mcseg.statements.shift import MIN_NEW_CASES, case_vector, density_ratio_weights
from mcseg.statements.table import CaseTable

__all__ = ["shift_split_rows", "summarise_shift_rows"]


def _measure(calibration: CaseTable, new: CaseTable, name: str, alpha: float,
             weights: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """Per structure ``(coverage, widths m x K)`` of statement ``name`` (a one-sided statement's width: its
    distance from its range's end, as the bounds give it)."""
    q = quantiles(calibration, name, alpha) if weights is None else quantiles(calibration, name, alpha, *weights)
    lower, upper = bounds(new.unlabelled(), name, q)
    with np.errstate(invalid="ignore"):
        return covered(new, name, lower, upper).mean(0), upper - lower


def shift_split_rows(pool: CaseTable, conditions: dict[tuple[str, int], CaseTable], n_calibration: int,
                     alpha: float, repeats: int = 200, seed: int = 0) -> list[dict]:
    """One row per draw, condition (``(name, level)`` -> its labelled cases, named as the pool's), statement and
    structure (module docstring). A condition left with fewer than :data:`MIN_NEW_CASES` new cases in a draw is
    skipped in it (``n_new`` tells)."""
    if not pool.labelled or not all(t.labelled for t in conditions.values()):
        raise ValueError("random draws under shift need labelled pool and condition cases")
    if not 0 < n_calibration < len(pool):
        raise ValueError(f"{n_calibration} calibration cases of {len(pool)}: leave some to state about")
    foreign = {key: sorted(set(t.cases) - set(pool.cases)) for key, t in conditions.items()}
    for key, cases in foreign.items():
        if cases:
            raise ValueError(f"condition {key} holds {len(cases)} case(s) outside the pool ({', '.join(cases[:5])}): "
                             f"a draw could not keep them from calibrating")
    rng = np.random.default_rng(seed)
    rows = []
    for draw in range(repeats):
        order = rng.permutation(len(pool))
        calibration = pool.take(order[:n_calibration])
        drawn = set(calibration.cases)
        for (condition, level), table in conditions.items():
            new = table.take([i for i, c in enumerate(table.cases) if c not in drawn])
            if len(new) < MIN_NEW_CASES:
                continue
            weights = density_ratio_weights(case_vector(calibration), case_vector(new.unlabelled()), seed=draw)
            n_eff = effective_sample_size(weights[0])
            for name in available(calibration, new):
                plain, plain_width = _measure(calibration, new, name, alpha, None)
                weighted, weighted_width = _measure(calibration, new, name, alpha, weights)
                for k, structure in enumerate(pool.structures):
                    finite = weighted_width[:, k][np.isfinite(weighted_width[:, k])]
                    rows.append({"draw": draw, "condition": condition, "level": level, "statement": name,
                                 "structure": structure, "n_new": len(new), "coverage_plain": float(plain[k]),
                                 "coverage_weighted": float(weighted[k]),
                                 "width_plain": float(np.median(plain_width[:, k])),
                                 "width_weighted": float(np.median(finite)) if finite.size else float("inf"),
                                 "infinite_weighted": float(1 - finite.size / len(new)), "n_eff": n_eff})
    return rows


def summarise_shift_rows(rows: list[dict]) -> list[dict]:
    """Per level, statement and structure: each draw's means over the level's conditions, then over the draws
    their mean and, for the coverages, the standard error (sd over draws / sqrt(draws)); the median widths (the
    weighted one: its mean over the draws where it is finite), the mean share of infinite weighted bounds, the
    mean n_eff and the mean number of new cases per condition."""
    per_draw: dict[tuple, list[dict]] = {}
    for row in rows:
        per_draw.setdefault((row["level"], row["statement"], row["structure"], row["draw"]), []).append(row)
    groups: dict[tuple, list[dict]] = {}
    for (level, name, structure, draw), group in per_draw.items():
        mean = {key: float(np.mean([r[key] for r in group])) for key in
                ("coverage_plain", "coverage_weighted", "width_plain", "width_weighted", "infinite_weighted",
                 "n_eff", "n_new")}
        groups.setdefault((level, name, structure), []).append(mean)
    out = []
    for (level, name, structure), draws in sorted(groups.items(), key=lambda item: item[0][0]):
        entry = {"level": level, "statement": name, "structure": structure, "draws": len(draws),
                 "conditions": len({r["condition"] for r in rows if r["level"] == level})}
        for key in ("coverage_plain", "coverage_weighted"):
            values = np.array([d[key] for d in draws])
            entry[key] = float(values.mean())
            entry[f"{key}_se"] = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
        finite = [d["width_weighted"] for d in draws if np.isfinite(d["width_weighted"])]
        entry.update(width_plain=float(np.mean([d["width_plain"] for d in draws])),
                     width_weighted=float(np.mean(finite)) if finite else float("inf"),
                     infinite_weighted=float(np.mean([d["infinite_weighted"] for d in draws])),
                     n_eff=float(np.mean([d["n_eff"] for d in draws])),
                     n_new=float(np.mean([d["n_new"] for d in draws])))
        out.append(entry)
    return out

"""The report under shift: per configuration, predictor and suite, each metric by severity level over seeds.

A predictor of a configuration (:func:`mcseg.report.table.predictor_evaluations`: its single networks, their
variants, its ensembles, each raw and after every post-hoc scaler, named by
:func:`mcseg.report.table.predictor_names`) has one ``shift_summary.json`` per evaluation ``e`` under a suite
(:mod:`mcseg.evaluation.shift`; the evaluations of ``single`` are the configuration's seeds). With
``m_e(c, s)`` its value of a metric under corruption ``c`` at level ``s`` (a mean over cases; level 0 the
clean evaluation):

* level ``s``: ``M_e(s) = mean_c m_e(c, s)`` (the corruptions with a value), then mean ± std (ddof=1) over ``e``;
* overall and degradation: ROOD-MRI's scores of each ``e`` (:func:`mcseg.metrics.robustness.suite_robustness`,
  per corruption then averaged over corruptions), then mean ± std over ``e``;
* per corruption and level (the boxes of the severity figure): ``mean_e m_e(c, s)``.

Only the corruptions (with the same definition) and levels that every evaluation of the predictor has are
taken, so each number is over the same conditions; what is left out is warned of. A shift summary whose level 0
is not its evaluation's ``summary.json`` (that folder evaluated again without a suite) is left out, warned of.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from mcseg.evaluation.shift import mean_over_corruptions, shift_metrics
from mcseg.metrics.robustness import suite_robustness
from mcseg.report.table import ConfigRow, mean_std_n, predictor_evaluations, predictor_names

log = logging.getLogger(__name__)

Cell = tuple[float, float, int]  # mean, std (ddof=1; NaN for one value), n


@dataclass
class ShiftCells:
    """One predictor of a configuration under one suite, aggregated over its ``n`` evaluations."""

    corruptions: list[str]
    levels: list[int]  # 0 (clean) first
    n: int
    alpha: float
    higher_is_better: dict[str, bool] = field(default_factory=dict)  # metric ->
    by_level: dict[str, dict[int, Cell | None]] = field(default_factory=dict)  # metric -> level -> over e of M_e(s)
    scores: dict[str, dict[str, Cell | None]] = field(default_factory=dict)  # metric -> overall/degradation ->
    per_corruption: dict[str, dict[str, dict[int, float | None]]] = field(default_factory=dict)  # metric -> c -> s ->


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _mean(values) -> float | None:
    cell = mean_std_n(values)
    return None if cell is None else cell[0]


def clean_matches(shift: dict, summary: dict) -> bool:
    """Whether the raw level 0 of ``shift`` (a shift_summary.json) is the clean evaluation ``summary`` beside it."""
    raw = (shift.get("predictors") or {}).get("raw") or {}
    return all(values.get("0") == _number(summary.get(key)) for metric, (key, _) in shift_metrics().items()
               for values in (raw.get(metric) or {}).get("values", {}).values())


def aggregate_shift(evaluations: list[tuple[dict, dict]], where: str = "") -> ShiftCells | None:
    """:class:`ShiftCells` of ``evaluations``: (shift_summary.json, its ``predictors[<predictor>]``) pairs of one
    suite; None when they have no corruption in common. ``where`` names them in warnings."""
    if not evaluations:
        raise ValueError("aggregate_shift: no evaluations to aggregate")
    first = evaluations[0][0]
    definitions = first.get("definitions") or {}
    corruptions = [c for c in first["corruptions"]
                   if all(c in s["corruptions"] and (s.get("definitions") or {}).get(c) == definitions.get(c)
                          for s, _ in evaluations)]
    levels = sorted(set.intersection(*(set(map(int, s["levels"])) for s, _ in evaluations)) | {0})
    left_out = sorted({c for s, _ in evaluations for c in s["corruptions"]} - set(corruptions))
    left_levels = sorted({int(x) for s, _ in evaluations for x in s["levels"]} - set(levels))
    if left_out or left_levels:
        log.warning("%s: its %d evaluations under suite %s differ in corruptions or levels: only those all have "
                    "are aggregated (left out: corruptions %s, levels %s)", where, len(evaluations), first["suite"],
                    left_out, left_levels)
    if not corruptions:
        return None
    alphas = sorted({float(s["alpha"]) for s, _ in evaluations})
    if len(alphas) > 1:
        log.warning("%s: level-weight bases alpha %s differ; the scores use %s", where, alphas, first["alpha"])
    out = ShiftCells(corruptions, levels, len(evaluations), float(first["alpha"]))
    metrics = list(dict.fromkeys(m for _, block in evaluations for m in block))
    for metric in metrics:
        tables = []  # per evaluation: corruption -> level ("0", "1", ...) -> value
        for _, block in evaluations:
            if metric in block:
                out.higher_is_better[metric] = bool(block[metric]["higher_is_better"])
                values = block[metric]["values"]
                tables.append({c: {str(s): values[c].get(str(s)) for s in levels} for c in corruptions})
        scores = [suite_robustness(t, out.higher_is_better[metric], out.alpha) for t in tables]
        out.by_level[metric] = {s: mean_std_n(mean_over_corruptions(t, str(s)) for t in tables) for s in levels}
        out.scores[metric] = {k: mean_std_n(score[k] for score in scores) for k in ("overall", "degradation")}
        out.per_corruption[metric] = {c: {s: _mean(t[c][str(s)] for t in tables) for s in levels}
                                      for c in corruptions}
    return out


def add_shift(rows: list[ConfigRow], ensembles: list) -> None:
    """Each row's ``shift``: suite -> predictor -> :class:`ShiftCells` of the evaluations under shift of its
    predictors (raw and each post-hoc scaler of each shift summary)."""
    for row in rows:
        found: dict[str, dict[str, list[tuple[dict, dict]]]] = {}
        for name, summary, shift in predictor_evaluations(row, ensembles):
            if shift is None:
                continue
            if not clean_matches(shift, summary):
                log.warning("%s: its level 0 is not the evaluation beside it (evaluated again since, without a "
                            "suite); left out until the suite is evaluated again", shift.get("clean_evaluation"))
                continue
            for predictor, block in (shift.get("predictors") or {}).items():
                raw, scaled = predictor_names(name, predictor)
                label = raw if predictor == "raw" else scaled
                if label is not None:
                    found.setdefault(shift["suite"], {}).setdefault(label, []).append((shift, block))
        row.shift = {}
        for suite, predictors in found.items():
            for label, evaluations in predictors.items():
                cells = aggregate_shift(evaluations, f"{row.loss_name} {row.hyperparameters}, {label}")
                if cells is not None:
                    row.shift.setdefault(suite, {})[label] = cells

"""The report's aggregation under shift (mcseg.report.shift) on hand-made shift summaries: only what every
evaluation has is aggregated, and a summary whose level 0 is not its evaluation's is left out."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from mcseg.report.shift import aggregate_shift, clean_matches


def _summary(values: dict[str, dict[str, float]], definitions=None, alpha=0.5) -> tuple[dict, dict]:
    """A shift_summary.json of Dice ``values`` (corruption -> level -> value) and its raw predictor block."""
    levels = sorted({int(s) for v in values.values() for s in v})
    summary = {"suite": "toy", "corruptions": list(values), "levels": levels, "alpha": alpha,
               "definitions": definitions or {c: {"kind": "blur"} for c in values},
               "predictors": {"raw": {"dice": {"higher_is_better": True, "values": values}}}}
    return summary, summary["predictors"]["raw"]


def test_only_the_corruptions_and_levels_every_evaluation_has_are_aggregated(caplog):
    e1 = _summary({"a": {"0": 0.9, "1": 0.8, "2": 0.5}, "b": {"0": 0.9, "1": 0.6, "2": 0.4}})
    e2 = _summary({"a": {"0": 0.7, "1": 0.7}, "b": {"0": 0.7, "1": 0.3}, "c": {"0": 0.7, "1": 0.0}})
    with caplog.at_level(logging.WARNING):
        cells = aggregate_shift([e1, e2], "ce defaults, single")
    assert "ce defaults, single" in caplog.text and "['c']" in caplog.text and "[2]" in caplog.text
    assert cells.corruptions == ["a", "b"] and cells.levels == [0, 1] and cells.n == 2
    # level 1: (0.8 + 0.6) / 2 = 0.7 and (0.7 + 0.3) / 2 = 0.5 -> mean 0.6, std sqrt(0.02)
    mean, std, n = cells.by_level["dice"][1]
    assert (mean, std, n) == (pytest.approx(0.6), pytest.approx(np.sqrt(0.02)), 2)
    assert cells.by_level["dice"][0][:2] == (pytest.approx(0.8), pytest.approx(np.sqrt(0.02)))
    # over levels 0 and 1 only, w_1 = 0.5: degradation of e1 = mean(0.1, 0.3) = 0.2, of e2 = mean(0, 0.4) = 0.2
    assert cells.scores["dice"]["degradation"][:2] == (pytest.approx(0.2), pytest.approx(0.0))
    # overall of e1 = mean((0.9 + 0.4) / 1.5, (0.9 + 0.3) / 1.5), of e2 = mean((0.7 + 0.35) / 1.5, (0.7 + 0.15) / 1.5)
    assert cells.scores["dice"]["overall"][0] == pytest.approx(np.mean([2.5 / 3, 1.9 / 3]))
    assert cells.per_corruption["dice"]["b"] == {0: pytest.approx(0.8), 1: pytest.approx(0.45)}


def test_a_corruption_defined_otherwise_in_some_evaluation_is_left_out():
    e1 = _summary({"a": {"0": 0.9, "1": 0.8}, "b": {"0": 0.9, "1": 0.6}})
    e2 = _summary({"a": {"0": 0.9, "1": 0.8}, "b": {"0": 0.9, "1": 0.6}},
                  definitions={"a": {"kind": "blur"}, "b": {"kind": "blur", "levels": {"std": [9]}}})
    assert aggregate_shift([e1, e2]).corruptions == ["a"]
    assert aggregate_shift([e2, _summary({"c": {"0": 0.9, "1": 0.8}})]) is None  # nothing in common


def test_a_shift_summary_is_the_evaluation_beside_it_only_if_its_level_0_is():
    summary, _ = _summary({"a": {"0": 0.9, "1": 0.8}, "b": {"0": 0.9, "1": 0.6}})
    assert clean_matches(summary, {"mean_foreground_dice": 0.9})
    assert not clean_matches(summary, {"mean_foreground_dice": 0.85})  # evaluated again since, without a suite

"""Registries refuse what they cannot hold (issue #56, item 3): a second entry under a taken name is refused naming
both (conformal losses, post-hoc scalers, prediction formats, the table of figures, statements, trackers), and a
conformal loss is one entry that holds its formula: a toy risk added as one entry is computed as its formula says,
not as another loss."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mcseg.conformal import CaseSummary, ConformalSettings, case_test, fit_thresholds, summarise
from mcseg.conformal.risks import LOSSES, Loss, loss_table
from mcseg.registry import DuplicateName, unique


def test_unique_names_both_entries():
    class A:
        name = "x"

    class B:
        name = "x"

    with pytest.raises(DuplicateName, match=r"scaler 'x' is declared twice: by .*A and by .*B"):
        unique([A, B], lambda e: e.name, "scaler")
    assert unique([A], lambda e: e.name, "scaler") == {"x": A}


def _miss(hits, selected, positives):
    """A toy risk: 1 when the set misses more than half of the class, else 0 (monotone in the threshold)."""
    return (hits < positives / 2).astype(np.float64)


def test_a_toy_conformal_loss_is_one_entry_with_its_formula(monkeypatch):
    monkeypatch.setitem(LOSSES, "miss", Loss("miss", True, "largest", 1.0, "the set misses half the class", _miss))
    rng = np.random.default_rng(0)
    summaries, truths, probs_all = [], [], []
    for i in range(12):
        truth = torch.zeros(2, 6, 6, dtype=torch.bool)
        truth[1, 1:5, 1:5] = True
        truth[0] = ~truth[1]
        p1 = np.clip(truth[1].numpy() * 0.6 + rng.uniform(0, 0.4, (6, 6)), 0, 1)
        probs = torch.from_numpy(np.stack([1 - p1, p1])).float()
        pred = np.stack([p1 < 0.5, p1 >= 0.5])
        summaries.append(summarise(f"c{i}", probs, truth, pred, (1.0, 1.0), torch.linspace(0, 1, 21)))
        truths.append(truth.numpy())
        probs_all.append(p1)
    stacked = CaseSummary.stack(summaries)
    table, _ = loss_table(stacked.counts, 1, "miss")
    for row, p1, truth in zip(table, probs_all, truths):  # the formula on each case and grid threshold
        g = truth[1]
        expected = [float(((p1 >= t) & g).sum() < g.sum() / 2) for t in np.linspace(0, 1, 21)]
        np.testing.assert_array_equal(row, expected)
    fit = fit_thresholds(stacked, ConformalSettings(alpha=0.3, loss="miss", classes=[1]))[1]
    n = len(table)
    bound = n / (n + 1) * table.mean(0) + 1 / (n + 1)
    j = fit["index"]
    assert bound[j] <= 0.3 and (j + 1 == len(bound) or bound[j + 1] > 0.3)
    sets = {1: {"set": probs_all[0] >= 0.99, "possible": probs_all[0] >= 0, "sure": probs_all[0] > 2}}
    assert case_test(sets, truths[0], truths[0], "miss")[1]["loss"] == 1.0


def test_a_format_under_a_taken_name_is_refused(monkeypatch):
    from mcseg.evaluation import formats
    from mcseg.evaluation.formats.nnunet import NnUNetFormat

    class Impostor(NnUNetFormat):
        @classmethod
        def pattern(cls, **options) -> str:
            return "<case>.npy"

    monkeypatch.setattr(formats, "FORMATS", [*formats.FORMATS, Impostor])
    with pytest.raises(DuplicateName, match=r"prediction format 'nnunet' is declared twice: .*NnUNetFormat and .*Impostor"):
        formats.format_names()

    class SamePattern(NnUNetFormat):
        format = "other"

    monkeypatch.setattr(formats, "FORMATS", [*formats.FORMATS[:3], SamePattern])
    with pytest.raises(DuplicateName, match="prediction file pattern '<case>.npz'"):
        formats.format_names()


def test_a_figure_key_or_scorer_declared_twice_is_refused(monkeypatch):
    from mcseg.evaluation import figure_table as figures

    monkeypatch.setattr(figures, "SCORERS", [*figures.SCORERS, figures.SCORERS[0]])
    with pytest.raises(DuplicateName, match="scorer 'OverlapScorer' is declared twice"):
        figures.table()


def test_a_scaler_under_a_taken_name_is_refused():
    from mcseg.calibration.scaler_interface import TemperatureScaler
    from mcseg.calibration.scaler_registry import SCALER_TYPES

    class Mine(TemperatureScaler):
        pass

    with pytest.raises(DuplicateName, match="post-hoc scaler 'temperature' is declared twice"):
        unique([*SCALER_TYPES.values(), Mine], lambda s: s.name, "post-hoc scaler")


def test_two_trackers_under_one_name_are_refused_before_either_opens(tmp_path):
    from mcseg.errors import ConfigError
    from mcseg.trackers import build_trackers

    node = {"_target_": "mcseg.trackers.csv_tracker.CSVTracker"}
    with pytest.raises(ConfigError, match="'logger.csv' and 'logger.again' both make a tracker named 'csv'"):
        build_trackers({"csv": node, "again": dict(node)}, tmp_path / "run")
    assert not (tmp_path / "run").exists()

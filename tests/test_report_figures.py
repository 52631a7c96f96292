"""mcseg-report's dataset reliability histograms: the evaluations' cells summed over seeds, one row of
panels per selected configuration."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from mcseg.report.figures import pooled_histogram, reliability_histograms
from mcseg.report.table import ConfigRow

from .metrics.test_evaluator import HIST_CASES, _hist_evaluator


def _row(loss: str, paths, selected=True) -> ConfigRow:
    return ConfigRow(dataset="d", loss_name=loss, configuration=loss, hyperparameters="defaults",
                     runs=[SimpleNamespace(path=p) for p in paths], seeds=list(range(len(paths))),
                     selection_value=None, selected=selected)


def test_report_histograms_sum_the_cases_of_every_seed(tmp_path):
    seeds = []
    for seed, cases in enumerate([HIST_CASES, HIST_CASES[:1]]):  # seed 1 evaluated one case only
        run = tmp_path / f"seed{seed}"
        _hist_evaluator(cases).write(run / "eval" / "test")
        seeds.append(run)
    hist, names = pooled_histogram(seeds, "test")
    want = 2 * _hist_evaluator(HIST_CASES[:1]).histogram_panels()[0] + _hist_evaluator(HIST_CASES[1:]).histogram_panels()[0]
    assert names == ["a", "b"]
    np.testing.assert_array_equal(hist, want)
    assert pooled_histogram([tmp_path / "no_eval"], "test") is None

    fig = reliability_histograms([_row("ce", seeds), _row("margin", seeds[:1]), _row("ls", seeds, selected=False)],
                                 "test")
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "ce: a", "ce: b", "ce: all classes", "margin: a", "margin: b", "margin: all classes"]
    fig.canvas.draw()
    assert reliability_histograms([_row("ce", [tmp_path / "no_eval"])], "test") is None

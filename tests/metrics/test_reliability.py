"""Reliability tables and figures from bin sums."""
from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure

from mcseg.metrics.binning import BinSums, bin_index, bin_sums
from mcseg.metrics.reliability import TABLE_COLUMNS, reliability_figure, reliability_table


def _sums():
    conf = torch.tensor([0.1, 0.3, 0.35, 0.9])
    return bin_sums(bin_index(conf, 4), conf, torch.tensor([False, True, False, True]), 4)


def test_table_by_hand():
    rows = reliability_table(_sums())
    assert [r["count"] for r in rows] == [1, 2, 0, 1] and set(rows[0]) == set(TABLE_COLUMNS)
    assert rows[1]["lo"] == 0.25 and rows[1]["hi"] == 0.5
    assert rows[1]["accuracy"] == pytest.approx(0.5) and rows[1]["mean_confidence"] == pytest.approx(0.325)
    assert rows[1]["gap"] == pytest.approx(0.175)
    assert math.isnan(rows[2]["accuracy"]) and rows[0]["panel"] == "top_label"


def test_figure_has_one_panel_per_row_with_the_ece_in_its_title():
    s = _sums()
    stacked = BinSums.stack([s, s + s])
    fig = reliability_figure(stacked, ["top-label", "class a"], title="val")
    assert isinstance(fig, Figure)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [f"top-label  ECE = {s.ece().item():.4f}", f"class a  ECE = {s.ece().item():.4f}"]
    fig.canvas.draw()  # renders on the Agg canvas without pyplot
    with pytest.raises(ValueError, match="panel names"):
        reliability_figure(stacked, ["only one"])

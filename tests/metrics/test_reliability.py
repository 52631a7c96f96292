"""Reliability tables and figures from bin sums."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from mcseg.metrics.binning import BinSums, bin_index, bin_sums
from mcseg.metrics.reliability import (
    TABLE_COLUMNS,
    case_histogram,
    histogram_figure,
    histogram_table,
    read_histogram_table,
    reliability_figure,
    reliability_table,
)


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


def test_case_histogram_puts_each_non_empty_bin_at_its_observed_frequency():
    # panel 0: bins with 1, 2, 0, 1 voxels of frequency 0, 1/2, -, 1 -> cells (f0, k0), (f1, k1), (f3, k3)
    # panel 1: 4 voxels in bin 2 of frequency 3/4 -> (f2, k2); 0.75 lies in (2/4, 3/4]
    sums = BinSums(torch.tensor([[1.0, 2, 0, 1], [0, 0, 4, 0]]), torch.zeros(2, 4),
                   torch.tensor([[0.0, 1, 0, 1], [0, 0, 3, 0]]))
    hist = case_histogram(sums)
    assert hist.dtype == np.int64 and hist.shape == (2, 4, 4)
    assert {(int(p), int(f), int(k)) for p, f, k in zip(*hist.nonzero())} == {(0, 0, 0), (0, 1, 1), (0, 3, 3),
                                                                               (1, 2, 2)}
    assert hist.sum() == 4
    rows = histogram_table(hist, ["a", "b"])
    back, names = read_histogram_table(rows)
    np.testing.assert_array_equal(back, hist)
    assert names == ["a", "b"]


def test_histogram_figure_has_a_panel_per_class_and_their_sum():
    hist = case_histogram(BinSums(torch.tensor([[1.0, 2, 0, 1]]), torch.zeros(1, 4), torch.tensor([[0.0, 1, 0, 1]])))
    fig = histogram_figure(np.concatenate([hist, 2 * hist]), ["a", "b"], title="test", voxels=np.ones((2, 4)))
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["a", "b", "all classes"]
    fig.canvas.draw()
    one = histogram_figure(hist, ["a"], total="sum")  # a single panel: no sum panel
    assert [ax.get_title() for ax in one.axes if ax.get_title()] == ["a"]
    with pytest.raises(ValueError, match="panel names"):
        histogram_figure(hist, ["a", "b"])

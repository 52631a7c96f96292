"""Equal-width (lo, hi] binning and the ECE/MCE of bin sums, hand-derived."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mcseg.metrics.binning import BinSums, bin_index, bin_sums

from .reference import bins_reference


@pytest.mark.parametrize(
    ("value", "n_bins", "expected"),
    [
        (0.0, 15, 0),  # 0 belongs to the first bin [0, 1/M]
        (1.0, 15, 14),  # exactly 1.0 goes to the last bin
        (0.5, 10, 4),  # exactly on the edge 5/10: (0.4, 0.5] -> bin 4, not bin 5 as with [lo, hi)
        (0.25, 4, 0),  # exactly on the edge 1/4
        (0.75, 4, 2),
        (np.nextafter(np.float32(0.5), np.float32(1)), 10, 5),  # one ulp above an edge
        (0.999, 1, 0),  # a single bin holds everything
    ],
)
def test_bin_index_puts_edges_in_the_lower_bin(value, n_bins, expected):
    assert bin_index(torch.tensor([value], dtype=torch.float32), n_bins).item() == expected


def test_bin_index_is_exact_where_float_rounding_lands_on_an_edge():
    # float32(1/3) = 0.3333333432... > 1/3, so it lies in (1/3, 2/3]; but fl32(v * 3) rounds to 1.0
    v32 = torch.tensor([1 / 3], dtype=torch.float32)
    assert (v32 * 3).item() == 1.0 and v32.double().item() > 1 / 3
    assert bin_index(v32, 3).item() == 1
    # float64(1/3) = 0.33333333333333331 < 1/3: first bin
    assert bin_index(torch.tensor([1 / 3], dtype=torch.float64), 3).item() == 0


def test_bin_index_matches_exact_float64_reference_on_random_values():
    g = torch.Generator().manual_seed(0)
    values = torch.rand(100_000, generator=g)
    values[:1000] = torch.arange(1000) / 1000  # many values on or next to edges 1/M
    for m in (1, 3, 10, 15, 20, 1000):
        np.testing.assert_array_equal(bin_index(values, m).numpy(), bins_reference(values.numpy(), m))


def test_bin_sums_and_ece_mce_by_hand():
    # bins of M = 4: 0.1 -> 0, 0.3 -> 1, 0.35 -> 1, 0.9 -> 3
    conf = torch.tensor([0.1, 0.3, 0.35, 0.9])
    correct = torch.tensor([False, True, False, True])
    sums = bin_sums(bin_index(conf, 4), conf, correct, 4)
    torch.testing.assert_close(sums.count, torch.tensor([1.0, 2.0, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(sums.correct, torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    # gaps: |0 - 0.1| = 0.1, |1/2 - 0.325| = 0.175, |1 - 0.9| = 0.1
    expected_ece = (1 * 0.1 + 2 * 0.175 + 1 * 0.1) / 4
    assert sums.ece().item() == pytest.approx(expected_ece, abs=1e-7)
    assert sums.mce().item() == pytest.approx(0.175, abs=1e-7)


def test_empty_bin_sums_give_nan():
    empty = BinSums.zeros(15)
    assert math.isnan(empty.ece().item()) and math.isnan(empty.mce().item())


def test_regroup_and_add_preserve_totals():
    g = torch.Generator().manual_seed(1)
    conf = torch.rand(1000, generator=g)
    correct = torch.rand(1000, generator=g) < conf
    fine = bin_sums(bin_index(conf, 20), conf, correct, 20)
    coarse = fine.regroup(torch.arange(20) // 4, 5)
    direct = bin_sums(bin_index(conf, 5), conf, correct, 5)
    for a, b in zip((coarse.count, coarse.confidence, coarse.correct), (direct.count, direct.confidence, direct.correct)):
        torch.testing.assert_close(a, b)
    doubled = fine + fine
    torch.testing.assert_close(doubled.ece(), fine.ece())


def test_bin_sums_are_the_index_add_sums_to_the_last_bit():
    """bin_sums (NumPy's bincounts on the CPU) adds each bin's values in voxel order, as torch's index_add_:
    the same float64 sums, not merely close ones; a 0/1 float ``correct`` counts as the boolean one."""
    g = torch.Generator().manual_seed(0)
    values = torch.rand(50_000, generator=g) ** 4
    correct = torch.rand(50_000, generator=g) < values
    bins = bin_index(values, 15)
    out = bin_sums(bins, values, correct, 15)
    conf = torch.zeros(15, dtype=torch.float64).index_add_(0, bins, values.double())
    assert torch.equal(out.confidence, conf)
    assert torch.equal(out.count, torch.bincount(bins, minlength=15).double())
    assert torch.equal(out.correct, torch.bincount(bins[correct], minlength=15).double())
    again = bin_sums(bins, values, correct.float(), 15)
    assert all(torch.equal(getattr(again, f), getattr(out, f)) for f in ("count", "confidence", "correct"))

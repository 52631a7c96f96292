"""Means, spreads and bootstrap intervals over cases; NaN excluded and counted."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mcseg.metrics.statistics import bootstrap_ci, describe


def test_describe_by_hand():
    d = describe([1.0, 2.0, float("nan"), 4.0], n_boot=200, seed=0)
    assert d["mean"] == pytest.approx(7 / 3) and d["median"] == 2.0
    assert d["std"] == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert d["n"] == 3 and d["n_undefined"] == 1
    lo, hi = d["ci95"]
    assert 1.0 <= lo <= 7 / 3 <= hi <= 4.0


def test_empty_and_single_values():
    d = describe([float("nan")], n_boot=100)
    assert math.isnan(d["mean"]) and d["n"] == 0 and d["n_undefined"] == 1 and all(map(math.isnan, d["ci95"]))
    one = describe([0.7], n_boot=100)
    assert one["mean"] == 0.7 and math.isnan(one["std"]) and one["ci95"] == [0.7, 0.7]


def test_bootstrap_is_seeded_and_covers_the_mean_at_the_expected_rate():
    values = np.random.default_rng(1).normal(5.0, 2.0, size=40)
    assert bootstrap_ci(values, 500, seed=3) == bootstrap_ci(values, 500, seed=3)
    assert bootstrap_ci(values, 500, seed=3) != bootstrap_ci(values, 500, seed=4)
    # coverage of the true mean over repeated samples: close to 95 % (percentile bootstrap, n = 40)
    rng = np.random.default_rng(2)
    hits = 0
    for i in range(200):
        lo, hi = bootstrap_ci(rng.normal(5.0, 2.0, size=40), 400, seed=i)
        hits += lo <= 5.0 <= hi
    assert 0.85 <= hits / 200 <= 0.99
    # the interval shrinks like 1/sqrt(n)
    wide = np.subtract(*bootstrap_ci(values[:10], 1000, 0)[::-1])
    narrow = np.subtract(*bootstrap_ci(np.tile(values[:10], 16), 1000, 0)[::-1])
    assert narrow == pytest.approx(wide / 4, rel=0.3)
    assert all(map(math.isnan, bootstrap_ci(values, 0)))

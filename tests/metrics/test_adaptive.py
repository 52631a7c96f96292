"""Adaptive (equal-mass, top-label) ECE: exact per case, bounded approximation when pooled."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcseg.metrics.adaptive import N_FINE, adaptive_ece, adaptive_ece_from_histogram, fine_bucket, fine_histogram
from mcseg.metrics.binning import bin_sums

from .reference import adaptive_ece_reference, binned_ece_reference


def test_by_hand_with_equal_mass_bins():
    # N = 6, M = 3: thresholds r_(2) = .6 and r_(4) = .8; bins {.5, .6}, {.7, .8}, {.9, .95}
    conf = torch.tensor([0.9, 0.5, 0.7, 0.95, 0.6, 0.8])
    hits = torch.tensor([True, False, True, True, True, False])
    # bin 1: acc 1/2 vs conf .55; bin 2: acc 1/2 vs .75; bin 3: acc 1 vs .925 -> (2*.05 + 2*.25 + 2*.075)/6
    assert adaptive_ece(conf, hits, n_bins=3) == pytest.approx((0.1 + 0.5 + 0.15) / 6, abs=1e-7)


def test_equals_array_split_definition_without_ties():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(1500, generator=g) * 0.5 + 0.5  # N divisible by M, continuous: no ties
    hits = torch.rand(1500, generator=g) < conf
    order = np.argsort(conf.numpy())
    groups = np.array_split(order, 15)  # the textbook equal-mass split (Mukhoti et al. 2020 code)
    bins = np.empty(1500, dtype=int)
    for b, idx in enumerate(groups):
        bins[idx] = b
    expected = binned_ece_reference(conf.numpy(), hits.numpy().astype(float), bins, 15)[0]
    assert adaptive_ece(conf, hits, 15) == pytest.approx(expected, abs=1e-12)


def test_ties_share_a_bin_and_the_value_does_not_depend_on_their_order():
    conf = torch.tensor([1.0] * 7 + [0.9, 0.8, 0.7])  # 70 % saturated confidences, as fp32 networks give
    hits = torch.tensor([True, False, True, True, False, True, True, True, False, True])
    value = adaptive_ece(conf, hits, n_bins=5)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(1))
    assert adaptive_ece(conf[perm], hits[perm], n_bins=5) == pytest.approx(value, abs=1e-15)
    # thresholds r_(2) = .8, r_(4..8) = 1.0: bins {.7, .8}, {.9, 1 x 7}; (|1 - 1.5| + |6 - 7.9|) / 10
    assert value == pytest.approx((0.5 + 1.9) / 10, abs=1e-7)


def test_fewer_voxels_than_bins_and_empty():
    assert adaptive_ece(torch.tensor([0.8]), torch.tensor([False]), 15) == pytest.approx(0.8)
    assert math.isnan(adaptive_ece(torch.tensor([]), torch.tensor([], dtype=torch.bool), 15))


@pytest.mark.parametrize("seed", range(4))
def test_exact_against_full_sort_on_concentrated_confidences(seed):
    # confidences piled up near 1 (most mass in few fine buckets) with exact ties mixed in
    g = torch.Generator().manual_seed(seed)
    conf = 1 - torch.rand(20_000, generator=g) ** 6 * 0.5
    conf[::7] = 1.0
    conf[::11] = conf[5]
    hits = torch.rand(20_000, generator=g) < conf
    for m in (2, 10, 15, 40):
        expected = adaptive_ece_reference(conf.numpy(), hits.numpy().astype(float), m)
        assert adaptive_ece(conf, hits, m) == pytest.approx(expected, abs=1e-12), m


def test_pooled_histogram_value_is_within_its_bound_and_tight_for_large_n():
    g = torch.Generator().manual_seed(5)
    conf = 1 - torch.rand(300_000, generator=g) ** 3 * 0.6
    hits = torch.rand(300_000, generator=g) < conf**2  # overconfident
    exact = adaptive_ece(conf, hits, 15)
    parts = [fine_histogram(conf[i::3], hits[i::3]) for i in range(3)]
    pooled, bound = adaptive_ece_from_histogram(parts[0] + parts[1] + parts[2], 15)
    assert abs(pooled - exact) <= bound
    assert bound < 4e-3 and abs(pooled - exact) < 1e-5


def test_fine_histogram_counts_every_voxel_once():
    conf = torch.tensor([0.0, 0.3, 0.5, 0.999999, 1.0], dtype=torch.float64)
    fine = fine_histogram(conf, torch.ones(5, dtype=torch.bool))
    assert fine.count.shape == (N_FINE,) and fine.count.sum().item() == 5
    assert fine_bucket(conf).tolist() == sorted(fine_bucket(conf).tolist())
    assert fine_bucket(torch.tensor([1.0])).item() == N_FINE - 1 and fine_bucket(torch.tensor([0.0])).item() == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, width=32), min_size=2, max_size=200))
def test_property_fine_bucket_is_monotone(values):
    conf = torch.tensor(sorted(values), dtype=torch.float32)
    keys = fine_bucket(conf)
    assert bool((keys[1:] >= keys[:-1]).all()) and int(keys.min()) >= 0 and int(keys.max()) < N_FINE


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), m=st.integers(1, 30), seed=st.integers(0, 10_000), ties=st.booleans())
def test_property_exact_matches_sorting_reference(n, m, seed, ties):
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(n, generator=g)
    if ties:
        conf = (conf * 4).round() / 4
    hits = torch.rand(n, generator=g) < 0.5
    value = adaptive_ece(conf, hits, m)
    assert value == pytest.approx(adaptive_ece_reference(conf.numpy(), hits.numpy().astype(float), m), abs=1e-12)
    assert 0.0 <= value <= 1.0
    top = bin_sums(torch.zeros(n, dtype=torch.int64), conf, hits, 1)  # one bin: |acc - conf| overall
    assert adaptive_ece(conf, hits, 1) == pytest.approx(top.ece().item(), abs=1e-12)

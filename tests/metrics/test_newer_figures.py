"""The figures issue #44 adds: smooth ECE against relplot (the authors' package), signed ECE against its
definition and identity, and fd-shifts' achievable AURC, e-AUGRC and bootstrap intervals against a re-derivation
of fd-shifts' code (tests/metrics/fd_shifts_reference.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mcseg.metrics.binning import bin_index, bin_sums
from mcseg.metrics.risk_coverage import (achievable_aurc, area_ci, augrc, aurc, eaugrc, optimal_augrc,
                                         risk_coverage)
from mcseg.metrics.smooth_ece import SmoothSums, smooth_ece, smooth_ece_sigma, smooth_sums
from tests.conftest import require
from tests.metrics import fd_shifts_reference as fds

relplot = require("relplot", "the smooth ECE authors' package, the reference of these tests (the test extra)")


def _points(regime: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = rng.beta(5, 1, size=n)
    truth = {"over": f**2, "calibrated": f, "under": np.sqrt(f)}[regime]
    return f, (rng.random(n) < truth).astype(np.float64)


# ------------------------------------------------------------------------------------------------ smooth ECE
@pytest.mark.parametrize("regime", ["over", "calibrated", "under"])
@pytest.mark.parametrize("n", [25, 30_000])
def test_smooth_ece_equals_relplot(regime, n):
    f, y = _points(regime, n, seed=n)
    sums = smooth_sums(torch.from_numpy(f), torch.from_numpy(y))
    ours, width = smooth_ece(sums, return_width=True)
    theirs, their_width = relplot.smECE(f, y, return_width=True)
    assert width == their_width
    assert abs(ours - theirs) < 1e-9
    for sigma in (0.2, 0.05, 0.004):  # 0.004: a node grid of 2500 intervals, not aligned with the cells
        assert abs(smooth_ece_sigma(sums, sigma) - relplot.smECE_sigma(f, y, sigma)) < 1e-9


def test_smooth_ece_of_tied_confidences_and_of_one_is_exact():
    # float32 voxels pile up on a few values, 1.0 among them: every cell holds one value, no approximation
    f = np.repeat([0.25, 0.5, 0.999, 1.0], [50, 70, 200, 400]).astype(np.float32)
    y = (np.arange(f.size) % 7 != 0).astype(np.float64)
    sums = smooth_sums(torch.from_numpy(f), torch.from_numpy(y))
    f = f.astype(np.float64)  # relplot computes in the input's precision: give it the same values in float64
    assert abs(smooth_ece(sums) - relplot.smECE(f, y)) < 1e-12


def test_smooth_ece_sums_add_and_pool_like_the_concatenation():
    f1, y1 = _points("over", 500, 1)
    f2, y2 = _points("under", 700, 2)
    pooled = smooth_sums(torch.from_numpy(f1), torch.from_numpy(y1)) + smooth_sums(torch.from_numpy(f2),
                                                                                    torch.from_numpy(y2))
    assert pooled.n_points == 1200
    assert abs(smooth_ece(pooled) - relplot.smECE(np.r_[f1, f2], np.r_[y1, y2])) < 1e-9


def test_smooth_ece_by_hand_on_a_perfectly_calibrated_and_a_constant_predictor():
    # outcomes that equal the confidence on average at every confidence: residual 0 at each node
    f = np.array([0.5, 0.5, 1.0])
    y = np.array([1.0, 0.0, 1.0])
    assert smooth_ece_sigma(smooth_sums(torch.from_numpy(f), torch.from_numpy(y)), 0.1) == pytest.approx(0, abs=1e-15)
    # one confidence 0.9, never right: |K*r| = 0.9 (K*1) everywhere, so smECE_sigma = 0.9 sum K*1 / sum (K*1 + 1e-4)
    f, y = np.full(40, 0.9), np.zeros(40)
    value = smooth_ece_sigma(smooth_sums(torch.from_numpy(f), torch.from_numpy(y)), 0.1)
    assert 0.9 * 0.99 < value < 0.9
    assert math.isnan(smooth_ece(SmoothSums.zeros()))


def test_smooth_ece_refuses_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        smooth_sums(torch.rand(3), torch.ones(4))
    with pytest.raises(ValueError, match="sigma"):
        smooth_ece_sigma(smooth_sums(torch.rand(3), torch.ones(3)), 0.0)


# ------------------------------------------------------------------------------------------------- signed ECE
def test_signed_ece_is_the_count_weighted_gap_and_the_difference_of_mean_confidence_and_accuracy():
    f, y = _points("over", 5000, 3)
    conf, hit = torch.from_numpy(f), torch.from_numpy(y)
    sums = bin_sums(bin_index(conf, 15), conf, hit, 15)
    by_bins = sum(float(sums.count[b]) / f.size * (float(sums.confidence[b] / sums.count[b]) -
                                                   float(sums.correct[b] / sums.count[b]))
                  for b in range(15) if sums.count[b] > 0)
    assert float(sums.signed_ece()) == pytest.approx(by_bins, abs=1e-12)
    assert float(sums.signed_ece()) == pytest.approx(f.mean() - y.mean(), abs=1e-12)
    assert float(sums.signed_ece()) > 0  # f^2 < f: over-confident
    under = _points("under", 5000, 3)
    u = bin_sums(bin_index(torch.from_numpy(under[0]), 15), torch.from_numpy(under[0]), torch.from_numpy(under[1]), 15)
    assert float(u.signed_ece()) < 0
    # |signed ECE| <= ECE: the signed gaps of the bins can only cancel
    assert abs(float(sums.signed_ece())) <= float(sums.ece()) + 1e-15


# ------------------------------------------------------------------------------------- fd-shifts' AURC family
def _cases(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    conf = np.round(rng.random(n), 1 if kind.endswith("ties") else 12)  # rounding makes tied confidences
    if kind.startswith("binary"):
        return conf, (rng.random(n) < 0.8 - 0.6 * conf).astype(np.float64)
    return conf, np.clip(0.5 - 0.4 * conf + 0.2 * rng.standard_normal(n), 0, 1)


@pytest.mark.parametrize("kind", ["continuous", "continuous_ties", "binary", "binary_ties"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_risk_coverage_areas_equal_fd_shifts(kind, seed):
    conf, risk = _cases(kind, 31, seed)
    assert aurc(conf, risk) * 1000 == pytest.approx(fds.aurc(conf, risk), abs=1e-9)
    assert augrc(conf, risk) * 1000 == pytest.approx(fds.augrc(conf, risk), abs=1e-9)
    assert achievable_aurc(conf, risk) * 1000 == pytest.approx(fds.aurc_achievable(conf, risk), abs=1e-9)
    assert optimal_augrc(risk) * 1000 == pytest.approx(fds.augrc_optimal(risk), abs=1e-9)
    assert eaugrc(conf, risk) * 1000 == pytest.approx(fds.augrc(conf, risk) - fds.augrc_optimal(risk), abs=1e-9)


@pytest.mark.parametrize("risk", [[0, 0, 0, 0], [1, 1, 1], [0, 1, 0, 1, 1]])
def test_achievable_aurc_of_flat_and_perfect_binary_rankings(risk):
    risk = np.asarray(risk, dtype=np.float64)
    conf = -risk + 0.01 * np.arange(risk.size)  # every wrong case less confident than every right one
    assert achievable_aurc(conf, risk) * 1000 == pytest.approx(fds.aurc_achievable(conf, risk), abs=1e-9)
    if 0 < risk.mean() < 1:  # a perfect order: the achievable curve is the optimum, whatever n (the linear one is not)
        ok = risk.size - risk.sum()
        # points (ok right, E = 0) and (n, E = n_wrong): 0 up to ok, then E linear in c
        expected = (risk.sum() - risk.sum() * ok * math.log(risk.size / ok) / (risk.size - ok)) / risk.size
        assert achievable_aurc(conf, risk) == pytest.approx(expected, abs=1e-12)


def test_achievable_aurc_by_hand_on_a_dominated_point():
    # falling confidence: right, wrong, right, wrong. ROC points (wrong, right): (0,0) (0,1) (1,1) (1,2) (2,2);
    # (1,1) lies below the hull (0,1)-(1,2), so the curve skips coverage 1/2
    conf, risk = np.array([4.0, 3.0, 2.0, 1.0]), np.array([0.0, 1.0, 0.0, 1.0])
    c, e = np.array([4.0, 3.0, 1.0]), np.array([2.0, 1.0, 0.0])
    expected = (e[0] - e[1] + (e[1] * c[0] - e[0] * c[1]) * math.log(c[0] / c[1]) / (c[0] - c[1])
                + e[1] - e[2] + (e[2] * c[1] - e[1] * c[2]) * math.log(c[1] / c[2]) / (c[1] - c[2]) + e[2]) / 4
    assert achievable_aurc(conf, risk) == pytest.approx(expected, abs=1e-12)
    assert achievable_aurc(conf, risk) * 1000 == pytest.approx(fds.aurc_achievable(conf, risk), abs=1e-9)


@pytest.mark.parametrize("area", ["aurc", "augrc"])
def test_bootstrap_intervals_equal_fd_shifts_with_the_same_seed(area):
    conf, risk = _cases("continuous_ties", 20, 5)
    np.random.seed(7)
    theirs = fds.ci_bs(conf, risk, generalized=area == "augrc", n_bs=400)
    ours = area_ci(conf, risk, area=area, n_boot=400, seed=7)
    assert np.allclose(np.array(ours) * 1000, theirs, atol=1e-9)
    lo, hi = ours
    assert lo <= (aurc if area == "aurc" else augrc)(conf, risk) <= hi


def test_bootstrap_interval_refuses_bad_arguments():
    with pytest.raises(ValueError, match="area"):
        area_ci([0.1, 0.2], [0.0, 1.0], area="auroc")
    with pytest.raises(ValueError, match="level"):
        area_ci([0.1, 0.2], [0.0, 1.0], level=95)
    with pytest.raises(ValueError, match="equal-length"):
        area_ci([0.1, 0.2], [0.0])
    assert all(math.isnan(v) for v in area_ci([0.1, 0.2], [0.0, 1.0], n_boot=0))


def test_moved_curve_keeps_its_points():
    curve = risk_coverage([0.9, 0.9, 0.5], [0.0, 1.0, 1.0])
    assert curve["coverage"].tolist() == [1.0, 2 / 3, 0.0]


@pytest.mark.parametrize("kind", ["continuous", "continuous_ties", "binary_ties"])
def test_resampled_areas_equal_the_curve_of_each_resample(kind):
    from mcseg.metrics.risk_coverage import _resampled_areas
    conf, risk = _cases(kind, 12, 3)
    draws = np.random.RandomState(0).randint(0, 12, size=(50, 12))
    for generalized, area in ((False, aurc), (True, augrc)):
        fast = _resampled_areas(conf, risk, draws, generalized)
        assert np.allclose(fast, [area(conf[d], risk[d]) for d in draws], atol=1e-13, rtol=0)


@pytest.mark.parametrize("kind", ["continuous", "continuous_ties", "binary_ties"])
@pytest.mark.parametrize("elements", [1, 40, 10**9])  # a row at a time, a few rows and a part row, all at once
def test_resamples_scored_a_few_rows_at_a_time_have_the_bits_of_all_at_once(kind, elements, monkeypatch):
    """The resamples are scored ROWS_ELEMENTS entries at a time (the temporaries of a thousand resamples of a
    thousand cases stay in the cache): every row's areas have the same bits as with every row at once."""
    from mcseg.metrics import risk_coverage

    conf, risk = _cases(kind, 17, 2)
    draws = np.random.RandomState(3).randint(0, 17, size=(23, 17))
    monkeypatch.setattr(risk_coverage, "ROWS_ELEMENTS", 10**9)
    whole = risk_coverage._resampled_both(conf, risk, draws)
    monkeypatch.setattr(risk_coverage, "ROWS_ELEMENTS", elements)
    parts = risk_coverage._resampled_both(conf, risk, draws)
    assert all(parts[area].tobytes() == whole[area].tobytes() for area in ("aurc", "augrc"))


@pytest.mark.parametrize("kind", ["continuous", "continuous_ties", "binary_ties"])
def test_both_intervals_from_one_resampling_equal_fd_shifts(kind):
    """area_cis (AURC and AUGRC from one set of resamples, the sort shared: failure detection's summary) gives
    each interval fd-shifts gives with the same seed, and area_ci's to the bit."""
    from mcseg.metrics.risk_coverage import area_cis

    conf, risk = _cases(kind, 20, 5)
    both = area_cis(conf, risk, n_boot=400, seed=7)
    for area in ("aurc", "augrc"):
        np.random.seed(7)
        theirs = fds.ci_bs(conf, risk, generalized=area == "augrc", n_bs=400)
        assert np.allclose(np.array(both[area]) * 1000, theirs, atol=1e-9)
        assert both[area] == area_ci(conf, risk, area=area, n_boot=400, seed=7)
    assert all(math.isnan(v) for pair in area_cis(conf, risk, n_boot=0).values() for v in pair)

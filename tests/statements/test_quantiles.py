"""The conformal quantiles of mcseg.statements against independent re-derivations, and the guarantees they give on
synthetic scores where they must hold (and fail with a wrong quantile index) (../shared/reference/
new_case_statements.md, C1, C4, C5)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mcseg.statements.quantiles import (conformal_quantile, effective_sample_size, minimum_cases,
                                        weighted_quantile)


def tibshirani(scores, weights, new_weight, alpha):
    """Tibshirani et al. 2019, eq. (8), written out: the distribution sum_i p_i delta_{s_i} + p_new delta_{+inf};
    its (1 - alpha) quantile is the smallest candidate t (a score or +inf) whose CDF reaches 1 - alpha."""
    total = sum(weights) + new_weight
    for t in sorted(set(scores)) + [math.inf]:
        cdf = sum(w for s, w in zip(scores, weights) if s <= t) / total + (new_weight / total if t == math.inf else 0)
        if cdf >= 1 - alpha - 1e-12:
            return t
    return math.inf


@pytest.mark.parametrize("seed", range(20))
def test_weighted_quantile_is_tibshiranis_formula(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    scores = rng.normal(size=n).round(1)  # ties on purpose
    weights = rng.exponential(size=n) * (rng.random(n) > 0.2)
    new_weight = float(rng.exponential())
    for alpha in (0.05, 0.1, 0.2, 0.5):
        assert weighted_quantile(scores, weights, new_weight, alpha) == tibshirani(
            list(scores), list(weights), new_weight, alpha)


@pytest.mark.parametrize("n", [1, 5, 9, 19, 31, 100])
def test_equal_weights_give_the_split_quantile(n):
    scores = np.random.default_rng(n).normal(size=n)
    for alpha in (0.03, 0.05, 0.1, 0.2):
        assert weighted_quantile(scores, np.ones(n), 1.0, alpha) == conformal_quantile(scores, alpha)


def test_split_quantile_index_and_infinity():
    scores = np.arange(1.0, 32.0)  # n = 31
    assert conformal_quantile(scores, 0.1) == 29.0  # k = ceil(32 x 0.9) = 29
    assert conformal_quantile(scores, 1 / 32) == 31.0 and conformal_quantile(scores, 0.03) == math.inf
    assert minimum_cases(0.1) == 9 and minimum_cases(0.05) == 19 and minimum_cases(0.2) == 4
    for alpha in (0.05, 0.1, 0.2, 0.3):
        m = minimum_cases(alpha)
        assert math.isfinite(conformal_quantile(np.ones(m), alpha))
        assert conformal_quantile(np.ones(m - 1), alpha) == math.inf


def test_effective_sample_size_of_the_calibration_weights():
    assert effective_sample_size(np.ones(31)) == pytest.approx(31)
    assert effective_sample_size([1.0, 0, 0, 0]) == pytest.approx(1)
    assert effective_sample_size([2.0, 1.0]) == pytest.approx(9 / 5)
    assert effective_sample_size(np.zeros(3)) == 0


def _coverage(quantile, n=19, alpha=0.1, repeats=4000, seed=0):
    """Mean coverage of a new iid score by ``quantile`` of n calibration scores, over ``repeats`` draws."""
    rng = np.random.default_rng(seed)
    draws = rng.normal(size=(repeats, n + 1))
    return np.mean([d[-1] <= quantile(d[:-1], alpha) for d in draws])


def _off_by_one(scores, alpha):
    values = np.sort(scores)
    k = math.ceil((len(values) + 1) * (1 - alpha)) - 1
    return float(values[k - 1])


def test_coverage_holds_and_a_wrong_index_is_caught():
    n, alpha, repeats = 19, 0.1, 4000
    se = math.sqrt(alpha * (1 - alpha) / repeats)
    covered = _coverage(conformal_quantile, n, alpha, repeats)
    assert 1 - alpha - 3 * se <= covered <= 1 - alpha + 1 / (n + 1) + 3 * se
    assert _coverage(_off_by_one, n, alpha, repeats) < 1 - alpha - 3 * se  # k - 1: the check catches it


def test_weighted_recovers_coverage_under_a_known_shift():
    """Calibration x ~ N(0, 1), new x ~ N(1, 1): w(x) = exp(x - 1/2); the score grows with x, so the plain quantile
    under-covers the new cases and the weighted one with the true ratio does not."""
    rng = np.random.default_rng(1)
    n, alpha, repeats = 100, 0.1, 1500
    plain, weighted = [], []
    for _ in range(repeats):
        x_cal, x_new = rng.normal(size=n), rng.normal(1.0, 1.0)
        s_cal = np.abs(rng.normal(size=n)) * np.exp(x_cal)
        s_new = abs(rng.normal()) * math.exp(x_new)
        plain.append(s_new <= conformal_quantile(s_cal, alpha))
        weighted.append(s_new <= weighted_quantile(s_cal, np.exp(x_cal - 0.5), math.exp(x_new - 0.5), alpha))
    se = math.sqrt(alpha * (1 - alpha) / repeats)
    assert np.mean(plain) < 1 - alpha - 3 * se
    assert np.mean(weighted) >= 1 - alpha - 3 * se

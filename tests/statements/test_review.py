"""The review flag's Learn-then-Test rule: hand-derived p-values and choices, the refusal when too few cases can
be accepted, and its guarantee on synthetic cases whose risk among the accepted is known in closed form
(../shared/reference/new_case_statements.md, C3)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mcseg.statements.review import fit_review, minimum_accepted, p_values


def test_minimum_accepted_is_the_smallest_n_with_a_chance():
    assert minimum_accepted(0.1, 0.1) == 22  # 0.9^22 = 0.098 <= 0.1 < 0.9^21 = 0.109
    assert 0.9 ** 22 <= 0.1 < 0.9 ** 21
    assert minimum_accepted(0.2, 0.1) == 11 and minimum_accepted(0.05, 0.1) == 45


def test_p_values_by_hand():
    u = np.array([0.05, 0.1, 0.2, 0.3, 0.5])
    failed = np.array([False, False, True, False, True])
    n, f, p = p_values(u, failed, np.array([0.0, 0.1, 0.25, 1.0]), 0.2)
    assert n.tolist() == [0, 2, 3, 5] and f.tolist() == [0, 0, 1, 2]
    assert p[0] == 1.0 and p[1] == pytest.approx(0.8 ** 2)
    assert p[2] == pytest.approx(0.8 ** 3 + 3 * 0.2 * 0.8 ** 2)
    assert p[3] == pytest.approx(sum(math.comb(5, j) * 0.2 ** j * 0.8 ** (5 - j) for j in range(3)))


def _table(n_ok: int, failures_at: list[float]):
    """n_ok successes with u spread over [0, 0.5), failures at the given u."""
    u = np.r_[np.linspace(0, 0.49, n_ok), failures_at]
    return u, np.r_[np.zeros(n_ok, bool), np.ones(len(failures_at), bool)]


def test_fixed_sequence_takes_the_loosest_certified_and_stops_at_the_first_failure():
    u, failed = _table(40, [0.6, 0.61, 0.62, 0.63, 0.64, 0.9])
    rule = fit_review(u, failed, alpha=0.1, delta=0.1, floor=0.7)
    assert rule.certified and rule.procedure == "fixed_sequence"
    # below 0.6 no failure: certified up to the grid value whose accepted failures make p > delta
    n, f, p = p_values(u, failed, np.linspace(0, 1, 101), 0.1)
    j = int(round(rule.threshold * 100))
    assert p[j] <= 0.1 and p[j + 1] > 0.1 and f[j] == rule.failures_accepted
    assert rule.flags(np.array([rule.threshold, rule.threshold + 0.01])).tolist() == [False, True]
    assert rule.flagged_share == pytest.approx((u > rule.threshold).mean())
    # a failure at the strict end stops the sequence at once: nothing certified, every case flagged
    u2 = np.r_[np.zeros(3), u]
    failed2 = np.r_[np.ones(3, bool), failed]
    strict = fit_review(u2, failed2, alpha=0.1, delta=0.1, floor=0.7)
    assert not strict.certified and math.isinf(strict.threshold) and strict.flags(np.zeros(2)).all()
    assert "every case is flagged" in strict.reason


def test_bonferroni_certifies_a_subset_of_what_fixed_sequence_can():
    u, failed = _table(90, [0.7, 0.8])  # Bonferroni over 101: 0.9^n <= 0.001 needs n >= 66
    fixed = fit_review(u, failed, 0.1, 0.1, 0.7)
    bonferroni = fit_review(u, failed, 0.1, 0.1, 0.7, procedure="bonferroni")
    assert bonferroni.certified and bonferroni.threshold <= fixed.threshold


def test_too_few_cases_is_refused_with_the_reason():
    u, failed = _table(15, [])
    rule = fit_review(u, failed, 0.1, 0.1, 0.7)
    assert not rule.certified and "at least 22 accepted cases" in rule.reason
    with pytest.raises(ValueError, match="procedure"):
        fit_review(u, failed, 0.1, 0.1, 0.7, procedure="holm")


def test_the_guarantee_holds_where_the_risk_is_known():
    """u ~ U(0, 1), failure with probability u: the risk among the accepted at s is R(s) = s / 2; the chosen s
    must have R(s) <= alpha in at least 1 - delta of the draws."""
    rng = np.random.default_rng(0)
    alpha, delta, n, repeats = 0.1, 0.1, 1000, 400
    violations, certified = 0, 0
    for _ in range(repeats):
        u = rng.random(n)
        rule = fit_review(u, rng.random(n) < u, alpha, delta, 0.7)
        certified += rule.certified
        violations += rule.certified and rule.threshold / 2 > alpha
    assert certified > repeats / 2  # the sequence starts where 22 cases are accepted (R = 0.011 there)
    assert violations / repeats <= delta + 3 * math.sqrt(delta * (1 - delta) / repeats)

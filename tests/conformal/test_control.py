"""Threshold selection: CRC against the closed form of the sorted per-case FNR curves, refusals of a loss that is
not monotone, LTT on the FDR, and a class absent from some calibration cases."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mcseg.conformal import ConformalSettings, NotMonotone, case_counts, control, default_thresholds, fit_thresholds
from mcseg.conformal.control import crc
from mcseg.conformal.risks import LOSSES, CaseCounts, Loss, class_masks, loss_table
from tests.conformal.synthetic import synthetic_case, synthetic_summaries


def closed_form_crc(probs: list[torch.Tensor], labels: list[torch.Tensor], k: int, alpha: float) -> float:
    """The largest t with n/(n+1) R_n(t) + 1/(n+1) <= alpha, R_n the mean of the per-case FNR curves
    FNR_i(t) = #{ground-truth voxels with p < t} / |G_i|: step functions that only change just after a
    ground-truth probability, so the supremum over all t is one of those values (or 0)."""
    curves = [np.sort(p[k][y == k].double().numpy()) for p, y in zip(probs, labels)]
    n = len(curves)
    candidates = np.unique(np.concatenate([[0.0], *curves]))
    risk = np.mean([np.searchsorted(c, candidates, side="left") / len(c) for c in curves], axis=0)
    valid = n / (n + 1) * risk + 1 / (n + 1) <= alpha
    return float(candidates[valid].max())


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_crc_threshold_is_the_closed_form_of_the_sorted_fnr_curves(alpha):
    rng = np.random.default_rng(int(alpha * 100))
    cases = [synthetic_case(rng, shape=(9, 10)) for _ in range(30)]
    probs, labels = [c[0] for c in cases], [c[1] for c in cases]
    expected = closed_form_crc(probs, labels, 1, alpha)
    exact = torch.from_numpy(np.unique(np.concatenate([[0.0], *[p[1][y == 1].double().numpy()
                                                                for p, y in cases]])))
    for grid, want in ((exact, expected), (default_thresholds(101), None)):
        counts = CaseCounts.stack([case_counts(p, class_masks(y, 3, False), grid) for p, y in cases])
        table, _ = loss_table(counts, 1, "fnr")
        fit = control(table, grid.numpy(), "fnr", "crc", alpha)
        if want is None:  # a coarse grid: its largest value at or below the exact threshold
            want = float(grid[grid <= expected + 1e-15].max())
        assert fit.threshold == want and fit.controlled
        n = len(table)
        assert n / (n + 1) * table[:, fit.index].mean() + 1 / (n + 1) <= alpha  # satisfies the bound ...
        if fit.index + 1 < len(grid):  # ... and is the largest grid value that does
            assert n / (n + 1) * table[:, fit.index + 1].mean() + 1 / (n + 1) > alpha


def test_crc_bound_b_equality_and_the_infeasible_alpha():
    grid = np.array([0.0, 0.5, 1.0])
    table = np.array([[0.0, 0.1, 1.0]] * 9)  # n = 9: bound at 0.5 = 0.9 * 0.1 + 0.1 B
    assert crc(table, grid, alpha=0.19).threshold == 0.5  # equality counts as valid (the theorem's <=)
    assert crc(table, grid, alpha=0.189).threshold == 0.0
    assert crc(table, grid, alpha=0.295, bound=2.0).threshold == 0.5  # 0.09 + B / (n + 1) = 0.29
    fit = crc(table, grid, alpha=0.09)  # alpha < B / (n + 1): nothing is valid, the whole volume, flagged
    assert fit.threshold == 0.0 and not fit.controlled


def test_crc_and_rcps_refuse_a_loss_they_cannot_prove_monotone_and_ltt_takes_it():
    rng = np.random.default_rng(3)
    summaries = synthetic_summaries(rng, 40)
    grid = default_thresholds().numpy()
    fdr, _ = loss_table(summaries.counts, 1, "fdr")
    for method in ("crc", "rcps"):
        with pytest.raises(NotMonotone, match=f"{method}: the fdr loss .* use method 'ltt'"):
            control(fdr, grid, "fdr", method, 0.2, delta=0.1)
    # a loss declared monotone whose table decreases for one case: refused, naming the case and the thresholds
    fnr, _ = loss_table(summaries.counts, 1, "fnr")
    bumpy = fnr.copy()
    bumpy[7, 50] = bumpy[7, 51] + 0.2
    with pytest.raises(NotMonotone, match="calibration case 7 decreases .* between grid thresholds 50 and 51"):
        control(bumpy, grid, Loss("bumpy", True, "largest", 1.0, "a bumpy loss", LOSSES["fnr"].formula), "crc", 0.2)
    fit = control(fdr, grid, "fdr", "ltt", 0.3, delta=0.1)
    assert fit.controlled and fit.risk <= 0.3 and fit.bound <= 0.1  # a valid lambda: its p-value passes Holm
    with pytest.raises(ValueError, match="delta None"):
        control(fdr, grid, "fdr", "ltt", 0.3)


def test_a_class_absent_from_some_calibration_cases_is_recorded_under_each_policy():
    rng = np.random.default_rng(4)
    summaries = synthetic_summaries(rng, 30, absent_every=3)  # class 2 absent from cases 0, 3, ..., 27
    absent = [f"case_{i:04d}" for i in range(0, 30, 3)]
    skip = fit_thresholds(summaries, ConformalSettings(alpha=0.1, classes=[1, 2]))
    zero = fit_thresholds(summaries, ConformalSettings(alpha=0.1, classes=[1, 2], absent="zero"))
    assert skip[2]["cases_without_class"] == zero[2]["cases_without_class"] == absent
    assert skip[2]["n_cases"] == 20 and zero[2]["n_cases"] == 30 and skip[1]["n_cases"] == 30
    assert zero[2]["threshold"] >= skip[2]["threshold"]  # zero losses let the threshold rise
    assert skip[1] == {**zero[1]}


def test_a_class_absent_from_every_calibration_case_is_refused_under_skip():
    rng = np.random.default_rng(5)
    summaries = synthetic_summaries(rng, 4, absent_every=1)  # class 2 in none
    with pytest.raises(ValueError, match="class channel 2: none of the 4 calibration cases contains it"):
        fit_thresholds(summaries, ConformalSettings(alpha=0.3, classes=[2]))
    fit = fit_thresholds(summaries, ConformalSettings(alpha=0.3, classes=[2], absent="zero"))[2]
    assert fit["threshold"] == 1.0 and fit["n_cases"] == 4  # nothing to miss: the smallest set

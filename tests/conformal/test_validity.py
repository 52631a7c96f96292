"""The guarantees hold on synthetic probabilities over many random calibration / test splits of a pool of cases
(a random split of a fixed pool makes calibration and test cases exchangeable): CRC's mean test FNR <= alpha,
RCPS's and LTT's violation rate <= delta, the margins' coverage >= 1 - alpha, each up to 3 Monte-Carlo standard
errors; with a class absent from a third of the cases."""
from __future__ import annotations

import numpy as np
import pytest

from mcseg.conformal import ConformalSettings, default_thresholds
from mcseg.conformal.validity import over_splits, summarise_splits
from tests.conformal.synthetic import synthetic_summaries

SPLITS, N_CAL = 200, 30


@pytest.fixture(scope="module")
def pool():
    return synthetic_summaries(np.random.default_rng(2026), 600, absent_every=3)  # class 2 absent from 200 cases


@pytest.fixture(scope="module")
def coarse():
    """The same cases on a grid of 51 thresholds (MAPIE's WSR bound costs n T^2 per fit)."""
    return synthetic_summaries(np.random.default_rng(2026), 600, default_thresholds(51), absent_every=3)


def _run(pool, **kw):
    settings = ConformalSettings(classes=[1, 2], **kw)
    return {k: summarise_splits(rows, settings.alpha) for k, rows in over_splits(pool, settings, N_CAL, SPLITS).items()}


@pytest.mark.parametrize("alpha,absent", [(0.1, "skip"), (0.2, "skip"), (0.1, "zero")])
def test_crc_mean_test_fnr_and_margin_coverage(pool, alpha, absent):
    for k, s in _run(pool, alpha=alpha, absent=absent).items():
        assert s["uncontrolled_splits"] == 0
        assert s["mean_test_risk"] <= alpha + 3 * s["mean_test_risk_se"], (k, s)
        assert s["mean_test_risk"] > alpha / 2, (k, s)  # not the trivial set: CRC is tight up to O(1/n) and the grid
        assert s["mean_covered"] >= 1 - alpha - 3 * s["mean_covered_se"], (k, s)
        assert s["mean_sure_inside"] >= 1 - alpha - 3 * s["mean_sure_inside_se"], (k, s)


# LTT on the monotone FNR with fixed-sequence testing: Bonferroni-Holm over 51 thresholds needs a p-value below
# delta / 51, out of reach of 30 cases (0.85^30 = 0.008 at best)
@pytest.mark.parametrize("method,loss,alpha,fwer", [("rcps", "fnr", 0.15, None), ("ltt", "fnr", 0.15, "fixed_sequence"),
                                                    ("ltt", "fdr", 0.45, "bonferroni_holm")])
def test_high_probability_methods_violate_at_most_delta_of_the_splits(coarse, method, loss, alpha, fwer):
    delta = 0.1
    for k, s in _run(coarse, alpha=alpha, delta=delta, method=method, loss=loss,
                     fwer=fwer or "bonferroni_holm").items():
        # class 2 has about 20 calibration cases: some splits cannot control it and return the safe end
        assert s["uncontrolled_splits"] < SPLITS / 4, (k, s)
        assert s["violation_rate"] <= delta + 3 * max(s["violation_rate_se"], np.sqrt(delta * (1 - delta) / SPLITS))
        assert s["mean_test_risk"] <= alpha, (k, s)


def test_validity_rows_name_the_classes_and_settings(pool):
    from mcseg.conformal.validity import validity_rows

    rows = validity_rows(pool, ConformalSettings(classes=[2], alpha=0.2), ["bg", "a", "b"], 40, repeats=5, seed=3)
    assert len(rows) == 1 and rows[0]["class"] == "b" and rows[0]["n_test"] == 560 and rows[0]["splits"] == 5
    assert rows[0]["mean_test_risk"] <= 0.2 + 3 * rows[0]["mean_test_risk_se"]

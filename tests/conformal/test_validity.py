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


def test_split_once_test_risk_and_volume_recomputed_from_the_probabilities():
    from mcseg.conformal import predicted_masks, summarise
    from mcseg.conformal.fit import CaseSummary
    from mcseg.conformal.risks import class_masks
    from mcseg.conformal.validity import split_once
    from tests.conformal.synthetic import synthetic_case

    rng = np.random.default_rng(7)
    cases = [synthetic_case(rng, shape=(10, 11)) for _ in range(24)]
    summaries = CaseSummary.stack([summarise(f"c{i}", p, class_masks(y, 3, False), predicted_masks(p, False),
                                             (1.0, 2.0), default_thresholds(), classes=[1, 2])
                                   for i, (p, y) in enumerate(cases)])
    rows = split_once(summaries.take(np.arange(18)), summaries.take(np.arange(18, 24)),
                      ConformalSettings(classes=[1, 2], alpha=0.2))
    for k, row in rows.items():
        t = row["threshold"]
        fnr = [1 - float(((p[k].double() >= t) & (y == k)).sum() / (y == k).sum()) for p, y in cases[18:]]
        stretch = [float((p[k].double() >= t).sum() / (p.argmax(0) == k).sum()) for p, _ in cases[18:]]
        assert row["test_risk"] == pytest.approx(np.mean(fnr))
        assert row["set_over_prediction"] == pytest.approx(np.mean(stretch)) and row["set_over_prediction"] > 1


def test_the_random_splits_differ_partition_the_pool_and_are_shared_by_the_alphas(monkeypatch):
    """What each repeat is fitted and measured on (split_once's arguments, recorded): REPEATS splits of the pool,
    each into n_calibration cases and the others, no two with the same calibration cases (a bug that reused one
    split, or one permutation, would give REPEATS equal ones whatever the seed); the same splits at every alpha of
    over_alphas, and again for the same seed."""
    from mcseg.conformal import validity

    summaries = synthetic_summaries(np.random.default_rng(5), 30)
    seen = []

    def recorded(calibration, test, settings):
        seen.append((settings.alpha, tuple(calibration.cases), tuple(test.cases)))
        return real(calibration, test, settings)

    real = validity.split_once
    monkeypatch.setattr(validity, "split_once", recorded)
    validity.over_alphas(summaries, ConformalSettings(classes=[1]), ["bg", "a", "b"], (0.1, 0.2), 12, seed=4)
    first, second = ([s[1:] for s in seen if s[0] == a] for a in (0.1, 0.2))
    assert len(first) == validity.REPEATS and first == second
    for calibration, test in first:
        assert len(calibration) == 12 and sorted(calibration + test) == summaries.cases
    assert len({frozenset(calibration) for calibration, _ in first}) == validity.REPEATS
    seen.clear()
    validity.over_splits(summaries, ConformalSettings(classes=[1]), 12, seed=4)
    assert [s[1:] for s in seen] == first

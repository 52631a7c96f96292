"""Uncertainty maps and failure detection (mcseg.metrics.uncertainty, mcseg.metrics.failure): hand-derived
values, an independent formulation each (torchmetrics' AUROC, brute-force pair counts, explicit loops)."""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from mcseg.metrics.failure import (FailureDetection, PooledAUROC, aggregate_uncertainty, auroc,
                                   micro_foreground_dice, ue_dice, ueo, validation_threshold)
from mcseg.metrics.risk_coverage import augrc, aurc, eaurc, risk_coverage
from mcseg.metrics.uncertainty import MemberAccumulator, entropy


# ------------------------------------------------------------------------------------------------ maps
def test_one_member_has_no_mutual_information_and_the_entropies_by_hand():
    p = torch.tensor([[0.5, 1.0], [0.5, 0.0]])  # two voxels: uniform, certain
    acc = MemberAccumulator()
    acc.add(p)
    maps = acc.maps()
    assert torch.allclose(maps["predictive_entropy"], torch.tensor([math.log(2), 0.0]))  # 0 ln 0 = 0
    assert torch.equal(maps["mutual_information"], torch.zeros(2))
    assert torch.allclose(maps["one_minus_max_prob"], torch.tensor([0.5, 0.0]))
    assert torch.allclose(acc.maps(normalised=True)["predictive_entropy"], torch.tensor([1.0, 0.0]))


def test_two_confident_members_that_disagree_are_all_epistemic():
    acc = MemberAccumulator()
    acc.add(torch.tensor([[1.0], [0.0]]))
    acc.add(torch.tensor([[0.0], [1.0]]))
    maps = acc.maps()
    assert torch.allclose(acc.mean(), torch.tensor([[0.5], [0.5]]))  # probabilities pooled, not logits
    assert torch.allclose(maps["predictive_entropy"], torch.tensor([math.log(2)]))
    assert torch.equal(maps["expected_entropy"], torch.zeros(1))
    assert torch.allclose(maps["mutual_information"], torch.tensor([math.log(2)]))


def test_maps_equal_an_explicit_formulation_over_members():
    g = torch.Generator().manual_seed(0)
    members = [torch.softmax(torch.randn(4, 6, 5, generator=g) * 3, 0) for _ in range(5)]
    acc = MemberAccumulator()
    for m in members:
        acc.add(m)
    mean = sum(members) / 5
    pe = -(mean * mean.log()).sum(0)
    ee = sum(-(m * m.log()).sum(0) for m in members) / 5
    maps = acc.maps()
    assert torch.allclose(maps["predictive_entropy"], pe, atol=1e-6)
    assert torch.allclose(maps["expected_entropy"], ee, atol=1e-6)
    assert torch.allclose(maps["mutual_information"], (pe - ee).clamp_min(0), atol=1e-6)
    assert (maps["mutual_information"] >= 0).all()
    norm = acc.maps(normalised=True)
    assert float(norm["predictive_entropy"].max()) <= 1 and float(norm["one_minus_max_prob"].max()) <= 1


def test_multilabel_entropy_is_the_sum_of_bernoulli_entropies_and_members_must_agree():
    p = torch.tensor([[0.5], [0.9]])
    expected = math.log(2) - (0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert math.isclose(float(entropy(p, multilabel=True)), expected, rel_tol=1e-6)
    acc = MemberAccumulator()
    acc.add(torch.ones(2, 3))
    with pytest.raises(ValueError, match="member 2 predicts shape"):
        acc.add(torch.ones(3, 3))


# ----------------------------------------------------------------------------------------- voxel AUROC
def test_auroc_by_hand_and_against_torchmetrics():
    u = torch.tensor([0.9, 0.8, 0.8, 0.1, 0.3])
    err = torch.tensor([True, True, False, False, False])
    # pairs (error, correct) where the error is more uncertain: 0.9 beats 3, 0.8 beats 2 and ties 1 -> 5.5 of 6
    assert math.isclose(auroc(u, err), 5.5 / 6)
    g = torch.Generator().manual_seed(1)
    u = torch.randint(0, 20, (500,), generator=g).float() / 20  # many ties
    err = torch.rand(500, generator=g) < u
    assert math.isclose(auroc(u, err), float(binary_auroc(u, err.long())), abs_tol=1e-6)
    assert math.isnan(auroc(u, torch.zeros(500, dtype=torch.bool)))


def test_pooled_auroc_equals_the_exact_one_when_values_fall_in_distinct_bins():
    g = torch.Generator().manual_seed(2)
    pooled = PooledAUROC(bins=1000)
    us, es = [], []
    for _ in range(3):  # three cases
        u = torch.randint(0, 1000, (300,), generator=g).float() / 1000 + 0.0005  # bin centres: exact
        e = torch.rand(300, generator=g) < u
        pooled.update(u, e)
        us.append(u), es.append(e)
    assert math.isclose(pooled.aggregate(), auroc(torch.cat(us), torch.cat(es)), abs_tol=1e-9)
    fine = PooledAUROC()  # 65536 bins: continuous values within binning error
    u = torch.rand(2000, generator=g)
    e = torch.rand(2000, generator=g) < u
    fine.update(u, e)
    assert abs(fine.aggregate() - auroc(u, e)) < 1e-3



def test_a_pooled_auroc_sent_to_another_process_merges_to_the_same_histograms():
    """A worker's PooledAUROC arrives as its occupied bins and is added in place (mcseg.evaluation.case_pool);
    merged, or used as it is, it is the histogram it was, and the pooled one equals one process's."""
    g = torch.Generator().manual_seed(5)
    cases = [(torch.rand(500, generator=g) ** k, torch.rand(500, generator=g) < 0.3) for k in (1, 2, 3)]
    one, pooled = PooledAUROC(), PooledAUROC()
    for i, (u, e) in enumerate(cases):
        one.update(u, e)
        part = PooledAUROC()
        part.update(u, e)
        sent = pickle.dumps(part)
        assert len(sent) < 500 * 2 * 16 + 2000  # the occupied bins, not 2 x 2^16 float64
        if i == 0:
            pooled.merge(pickle.loads(sent))
            continue
        arrived = pickle.loads(sent)
        pooled.merge(arrived)
        if i == 2:  # an arrived histogram used as it is: dense, equal, merged again the same
            assert torch.equal(arrived.errors, part.errors) and torch.equal(arrived.correct, part.correct)
            assert arrived.aggregate() == part.aggregate()
            again = PooledAUROC()
            again.merge(arrived)
            assert torch.equal(again.errors, part.errors)
    assert torch.equal(pooled.errors, one.errors) and torch.equal(pooled.correct, one.correct)
    assert pooled.aggregate() == one.aggregate()
    arrived.reset()
    assert arrived.errors.sum() == 0 and "_occupied" not in vars(arrived)

# ------------------------------------------------------------------------------------------------- UEO
def test_ue_dice_by_hand_and_ueo_takes_the_dataset_mean_maximum():
    u = torch.tensor([0.95, 0.6, 0.3, 0.0])
    e = torch.tensor([True, True, False, False])
    d = ue_dice(u, e, thresholds=(0.05, 0.5, 0.9))
    # t=0.05: U={0,1,2}: 2*2/(3+2); t=0.5: U={0,1}: 1; t=0.9: U={0}: 2*1/(1+2)
    assert torch.allclose(d, torch.tensor([0.8, 1.0, 2 / 3], dtype=torch.float64))
    assert float(ue_dice(torch.zeros(3), torch.zeros(3, dtype=torch.bool), (0.5,))[0]) == 1.0  # both empty
    a, b = torch.tensor([0.2, 0.9, 0.5]), torch.tensor([0.8, 0.6, 0.1])  # UE-Dice of two cases at 3 thresholds
    value, threshold = ueo([a, b], thresholds=(0.05, 0.5, 0.9))
    assert (value, threshold) == (pytest.approx(0.75), 0.5)  # the mean's maximum, not the per-case maxima


# ------------------------------------------------------------------------------------------ case level
def _aurc_brute(conf, risk):
    """Independent: the kept sets for every distinct threshold, trapezoid by explicit loop."""
    conf, risk = np.asarray(conf, float), np.asarray(risk, float)
    points = []
    for t in sorted(set(conf)):  # least confident threshold first: coverage 1 ... smallest
        kept = conf >= t
        points.append((kept.mean(), risk[kept].mean(), risk[kept].sum() / len(risk)))
    points.append((0.0, points[-1][1], 0.0))
    area_s = sum((c0 - c1) * (s0 + s1) / 2 for (c0, s0, _), (c1, s1, _) in zip(points, points[1:]))
    area_g = sum((c0 - c1) * (g0 + g1) / 2 for (c0, _, g0), (c1, _, g1) in zip(points, points[1:]))
    return area_s, area_g


def test_risk_coverage_by_hand_with_ties():
    conf, risk = [0.9, 0.5, 0.5, 0.1], [0.0, 1.0, 0.0, 1.0]
    curve = risk_coverage(conf, risk)
    assert np.allclose(curve["coverage"], [1.0, 0.75, 0.25, 0.0])  # the two 0.5 cases leave together
    assert np.allclose(curve["selective_risk"], [0.5, 1 / 3, 0.0, 0.0])
    assert np.allclose(curve["generalized_risk"], [0.5, 0.25, 0.0, 0.0])
    # trapezoids: 0.25*(0.5+1/3)/2 + 0.5*(1/3+0)/2 + 0.25*0
    assert math.isclose(aurc(conf, risk), 0.25 * (0.5 + 1 / 3) / 2 + 0.5 * (1 / 3) / 2)
    assert math.isclose(augrc(conf, risk), 0.25 * 0.75 / 2 + 0.5 * 0.25 / 2)


def test_aurc_augrc_and_eaurc_equal_a_brute_force_formulation():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(2, 30))
        conf = rng.integers(0, 6, n) / 5.0  # ties
        risk = rng.random(n)
        s, g = _aurc_brute(conf, risk)
        assert math.isclose(aurc(conf, risk), s, abs_tol=1e-12) and math.isclose(augrc(conf, risk), g, abs_tol=1e-12)
        best = _aurc_brute(-np.arange(n), np.sort(risk))[0]
        assert math.isclose(eaurc(conf, risk), s - best, abs_tol=1e-12)
        assert eaurc(conf, risk) >= -1e-12 and eaurc(-np.argsort(np.argsort(risk)), risk) < 1e-12


def test_case_scores_aggregate_as_values_does_and_bad_input_is_named():
    u = torch.zeros(12, 12)
    u[0, 0], u[11, 11] = 5.0, 1.0
    assert aggregate_uncertainty(u, "image") == 6.0
    assert aggregate_uncertainty(u, "patch", patch=10) == 5.0  # no 10 x 10 window holds both corners
    assert aggregate_uncertainty(u, "patch", patch=20) == 6.0  # cut to the image
    assert aggregate_uncertainty(u, "threshold", threshold=1.0) == 3.0
    assert aggregate_uncertainty(u, "threshold", threshold=9.0) == 0.0
    t = validation_threshold([torch.arange(10.0)], foreground_fractions=[0.2])
    assert math.isclose(t, 7.2, rel_tol=1e-6)  # the 0.8 quantile of 0..9
    with pytest.raises(ValueError, match="method='mean'"):
        aggregate_uncertainty(u, "mean")
    with pytest.raises(ValueError, match="needs the threshold"):
        aggregate_uncertainty(u, "threshold")
    with pytest.raises(ValueError, match="equal-length"):
        risk_coverage([0.1, 0.2], [0.3])


def test_window_sums_equal_average_pooling_times_the_window():
    from mcseg.metrics.failure import window_sums

    g = torch.Generator().manual_seed(4)
    u = torch.rand(13, 11, 7, generator=g, dtype=torch.float64)
    pooled = torch.nn.functional.avg_pool3d(u[None, None], (5, 5, 5), stride=1)[0, 0] * 125
    assert torch.allclose(window_sums(u, 5), pooled)
    assert torch.allclose(window_sums(u, 10)[..., :], torch.nn.functional.avg_pool3d(
        u[None, None], (10, 10, 7), stride=1)[0, 0] * 700)


def test_eaurc_of_binary_risks_uses_the_analytic_optimum_of_fd_shifts():
    # risks 0/1 with error rate r: AURC* = r + (1 - r) ln(1 - r) (Geifman et al.; fd-shifts' binary case), not the
    # discrete optimum of the sorted risks: for [0, 0, 1, 1] the latter is 0.25 (1/2 + 1/3) / 2 + 0.25 (1/3) / 2 = 7/48
    conf, risk = [0.9, 0.8, 0.7, 0.6], [0.0, 1.0, 0.0, 1.0]
    analytic = 0.5 + 0.5 * math.log(0.5)
    assert math.isclose(eaurc(conf, risk), aurc(conf, risk) - analytic, abs_tol=1e-12)
    assert not math.isclose(analytic, 7 / 48, abs_tol=1e-3)
    assert math.isclose(eaurc(conf, [1.0, 1.0, 1.0, 1.0]), 0.0, abs_tol=1e-12)  # r = 1: AURC* = 1, its limit
    assert math.isclose(eaurc(conf, [0.0] * 4), 0.0, abs_tol=1e-12)
    # a single non-binary risk: the discrete optimum of the sorted risks, as before
    risk = [0.0, 1.0, 0.5, 1.0]
    best = _aurc_brute(-np.arange(4), np.sort(risk))[0]
    assert math.isclose(eaurc(conf, risk), aurc(conf, risk) - best, abs_tol=1e-12)


def test_pooled_auroc_bound_by_hand_and_it_holds():
    # 2 bins: errors at 0.1 (bin 0) and 0.6 (bin 1), correct voxels at 0.2, 0.4 (bin 0) and 0.9 (bin 1)
    u, e = torch.tensor([0.1, 0.6, 0.2, 0.4, 0.9]), torch.tensor([True, True, False, False, False])
    pooled = PooledAUROC(bins=2)
    pooled.update(u, e)
    # pooled: error 0.1 ties both of bin 0 (1), error 0.6 beats bin 0 and ties 0.9 (2.5): 3.5 / 6; exact: 2 / 6
    assert math.isclose(pooled.aggregate(), 3.5 / 6) and math.isclose(auroc(u, e), 2 / 6)
    # the bound: every same-bin pair counted 1/2 instead of 0 or 1: (1 x 2 + 1 x 1) / (2 x 6), reached here
    assert math.isclose(pooled.max_error(), 0.25)
    g = torch.Generator().manual_seed(5)
    fine = PooledAUROC()
    u = torch.rand(3000, generator=g) ** 4  # crowded near 0: same-bin pairs
    e = torch.rand(3000, generator=g) < u
    fine.update(u, e)
    assert 0 < fine.max_error() < 1e-3 and abs(fine.aggregate() - auroc(u, e)) <= fine.max_error()
    assert math.isnan(PooledAUROC(bins=2).max_error())


# ---------------------------------------------------------------------------------------- definitions
def _micro_by_counts(pred, label, classes):
    """Independent: torchmetrics 0.11's micro Dice with ignore_index=0, the background column of the one-hot
    dropped: tp, fp, fn summed over the foreground classes, 2 tp / (2 tp + fp + fn)."""
    tp = fp = fn = 0
    for c in range(1, classes):
        p, y = pred == c, label == c
        tp, fp, fn = tp + int((p & y).sum()), fp + int((p & ~y).sum()), fn + int((~p & y).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")


def test_micro_foreground_dice_by_hand_and_against_summed_class_counts():
    label, pred = torch.tensor([1, 1, 1, 1, 2, 0]), torch.tensor([1, 1, 1, 1, 0, 2])
    # class 1: Dice 1, class 2: Dice 0 -> macro 0.5; micro: 2 x 4 / (5 + 5) = 0.8 (the large class weighs more)
    assert math.isclose(micro_foreground_dice(pred, label), 0.8)
    assert math.isnan(micro_foreground_dice(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)))
    g = torch.Generator().manual_seed(6)
    for _ in range(5):
        label, pred = torch.randint(0, 4, (7, 9), generator=g), torch.randint(0, 4, (7, 9), generator=g)
        assert math.isclose(micro_foreground_dice(pred, label), _micro_by_counts(pred, label, 4), rel_tol=1e-12)
    # multi-label: the regions' counts summed (R x S binary maps)
    y = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    p = torch.tensor([[1, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    assert math.isclose(micro_foreground_dice(p, y, multilabel=True), 2 * 2 / (4 + 3))


def test_the_summary_names_its_risk_and_voxel_region_beside_each_figure():
    fd = FailureDetection(["predictive_entropy"], region="all", risk="micro")
    u, e = torch.tensor([[0.9, 0.1, 0.2]]), torch.tensor([[True, False, False]])  # 2D maps
    fd.add_case("a", {"predictive_entropy": u}, e, None, 0.25)
    fd.add_case("b", {"predictive_entropy": u.flip(1)}, e, None, 0.5)
    summary = fd.summary()
    assert summary["protocol"]["voxel_region"] == "all" and summary["protocol"]["risk_definition"] == "micro"
    assert "micro" in summary["protocol"]["risk"] and "all" in summary["protocol"]["error_voxels"]
    assert summary["predictive_entropy"]["voxel_region"] == "all"
    assert (fd.rows[0]["risk_definition"], fd.rows[0]["voxel_region"]) == ("micro", "all")  # failure_per_case.csv
    default = FailureDetection(["predictive_entropy"]).summary()["protocol"]
    assert (default["voxel_region"], default["risk_definition"]) == ("union_foreground", "macro")
    with pytest.raises(ValueError, match="risk='dice'"):
        FailureDetection(["predictive_entropy"], risk="dice")
    from mcseg.config import FAILURE_RISKS
    from mcseg.metrics.failure import RISKS

    assert set(FAILURE_RISKS) == set(RISKS)  # the config's choices are the definitions the summary names

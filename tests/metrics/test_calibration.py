"""Calibration accumulators: hand-derived values, references, libraries, pooling."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcseg.metrics.calibration import CalibrationMetric, CalibrationStats, case_calibration

from .reference import bins_reference, calibration_reference, random_probs

KEYS = ("ece", "mce", "classwise_ece", "nll", "brier")


def test_tiny_case_by_hand():
    # K = 2, M = 2 (bins [0, .5], (.5, 1]); four voxels, labels 0 0 1 1
    probs = torch.tensor([[0.9, 0.6, 0.3, 0.5],
                          [0.1, 0.4, 0.7, 0.5]])
    label = torch.tensor([0, 1, 1, 1])
    v = case_calibration(probs, label, n_bins=2).values
    # top label: conf .9 .6 .7 .5 (ties -> class 0), correct 1 0 1 0; bin 0: {.5: 0}, bin 1: {.9: 1, .6: 0, .7: 1}
    # ECE = 1/4 |0 - .5| + 3/4 |2/3 - 2.2/3| = .125 + .05 = .175; MCE = max(.5, 1/15)
    assert v["ece"] == pytest.approx(0.175, abs=1e-7)
    assert v["mce"] == pytest.approx(0.5, abs=1e-7)
    # class 0: p0 = .9 .6 .3 .5, y0 = 1 0 0 0; bin 0 {.3, .5}: |0 - .8| = .8; bin 1 {.9, .6}: |1 - 1.5| = .5 -> 1.3/4
    # class 1: p1 = .1 .4 .7 .5, y1 = 0 1 1 1; bin 0 {.1, .4, .5}: |2 - 1| = 1; bin 1 {.7}: |1 - .7| = .3 -> 1.3/4
    assert v["class_ece"] == pytest.approx([0.325, 0.325], abs=1e-7)
    assert v["classwise_ece"] == pytest.approx(0.325, abs=1e-7)
    # NLL = -(log .9 + log .4 + log .7 + log .5)/4; Brier = (2*.01 + 2*.36 + 2*.09 + 2*.25)/4
    assert v["nll"] == pytest.approx(-(math.log(0.9) + math.log(0.4) + math.log(0.7) + math.log(0.5)) / 4, rel=1e-6)
    assert v["brier"] == pytest.approx((0.02 + 0.72 + 0.18 + 0.5) / 4, rel=1e-6)
    assert v["n_voxels"] == 4


def test_single_voxel_and_confidence_exactly_one():
    probs = torch.tensor([[1.0], [0.0], [0.0]])  # K = 3, a saturated voxel
    v = case_calibration(probs, torch.tensor([2]), n_bins=15).values
    assert v["ece"] == pytest.approx(1.0) and v["mce"] == pytest.approx(1.0)  # conf 1, wrong
    assert v["adaptive_ece"] == pytest.approx(1.0)
    # class 0: p 1 vs y 0 -> 1; class 1: p 0 vs y 0 -> 0; class 2: p 0 vs y 1 -> 1
    assert v["class_ece"] == pytest.approx([1.0, 0.0, 1.0])
    assert v["nll"] == pytest.approx(-math.log(1e-12))  # p_y = 0 is floored at 1e-12
    assert v["brier"] == pytest.approx(2.0)
    right = case_calibration(probs, torch.tensor([0]), n_bins=15).values
    assert right["ece"] == 0.0 and right["nll"] == 0.0 and right["brier"] == 0.0


def test_confidence_on_a_bin_edge_goes_to_the_lower_bin():
    # M = 10; top-label conf 0.5 (wrong), 0.45 (right), 0.55 (right). With (lo, hi] bins, 0.5 shares
    # (0.4, 0.5] with 0.45: (|1 - 0.95| + |1 - 0.55|) / 3 = 0.5 / 3. With [lo, hi) it would share
    # [0.5, 0.6) with 0.55 instead: (|1 - 1.05| + |1 - 0.45|) / 3 = 0.2.
    probs = torch.tensor([[0.5, 0.45, 0.55], [0.3, 0.35, 0.25], [0.2, 0.2, 0.2]])
    label = torch.tensor([1, 0, 0])
    v = case_calibration(probs, label, n_bins=10).values
    assert v["ece"] == pytest.approx(0.5 / 3, abs=1e-7)


def test_empty_region_gives_nan_and_zero_voxels():
    probs, label = random_probs(3, (4, 4), seed=0)
    v = case_calibration(probs, label, mask=torch.zeros(4, 4, dtype=torch.bool)).values
    assert v["n_voxels"] == 0
    for key in (*KEYS, "adaptive_ece"):
        assert math.isnan(v[key]), key


def test_absent_class_still_counts_in_classwise_ece():
    # K = 3 but label 2 never occurs: its term measures the mass put on class 2 (here 0.2 everywhere)
    probs = torch.tensor([[0.8, 0.1], [0.0, 0.7], [0.2, 0.2]])
    label = torch.tensor([0, 1])
    v = case_calibration(probs, label, n_bins=5).values
    assert len(v["class_ece"]) == 3
    assert v["class_ece"][2] == pytest.approx(0.2, abs=1e-7)  # bin (0, .2]: |0 - .2|


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7, 9), (6, 7, 8)])
def test_matches_naive_reference_on_random_volumes(dtype, shape):
    probs, label = random_probs(5, shape, seed=1, dtype=dtype)
    v = case_calibration(probs, label, n_bins=15).values
    ref = calibration_reference(probs.reshape(5, -1).numpy(), label.reshape(-1).numpy(), 15)
    for key in KEYS:
        assert v[key] == pytest.approx(ref[key], abs=1e-9), key
    np.testing.assert_allclose(v["class_ece"], ref["class_ece"], atol=1e-9)


def test_region_mask_equals_evaluating_the_selected_voxels():
    probs, label = random_probs(4, (10, 11, 12), seed=2)
    mask = torch.rand(10, 11, 12, generator=torch.Generator().manual_seed(3)) < 0.3
    masked = case_calibration(probs, label, mask=mask).values
    selected = case_calibration(probs[:, mask][:, :, None], label[mask][:, None]).values
    for key in (*KEYS, "adaptive_ece", "n_voxels"):
        assert masked[key] == pytest.approx(selected[key], abs=1e-12), key


def test_agrees_with_torchmetrics_top_label_ece_and_mce():
    from torchmetrics.functional.classification import multiclass_calibration_error

    for seed, shape in ((4, (16, 16, 12)), (5, (40, 40))):
        probs, label = random_probs(6, shape, seed=seed, dtype=torch.float64)
        v = case_calibration(probs, label, n_bins=15).values
        flat, target = probs.reshape(6, -1).T, label.reshape(-1)
        # random continuous confidences never sit on a bin edge, where torchmetrics' [lo, hi) differs
        for norm, key in (("l1", "ece"), ("max", "mce")):
            theirs = multiclass_calibration_error(flat, target, 6, n_bins=15, norm=norm).item()
            assert v[key] == pytest.approx(theirs, abs=1e-6), key


def test_agrees_with_monai_per_class_calibration_error():
    from monai.metrics import CalibrationErrorMetric

    probs, label = random_probs(4, (12, 12, 10), seed=6)
    v = case_calibration(probs, label, n_bins=20).values  # region "all": MONAI uses every voxel
    onehot = torch.nn.functional.one_hot(label, 4).movedim(-1, 0)[None].float()
    for right in (False, True):  # MONAI's right=False is (lo, hi] too (torch.bucketize semantics)
        theirs = CalibrationErrorMetric(num_bins=20, metric_reduction="none", right=right)(probs[None], onehot)
        np.testing.assert_allclose(v["class_ece"], theirs[0].numpy(), atol=1e-6)


def test_classwise_ece_equals_monai_calibration_error_metric_on_20_cases():
    """MONAI 1.6's ``CalibrationErrorMetric`` as an independent check of mcseg's classwise ECE, like with like.

    MONAI: for each image b and class c of a ``B x C x spatial`` batch (probabilities, one-hot labels),
    bins over p_c (torch.bucketize on float32 edges ``linspace(0, 1 + eps, M + 1)``, clamped to M - 1),
    ``"expected"`` = sum_k n_k |mean p - mean y| / sum_k n_k, i.e. ``|sum p - sum y|`` per bin over the
    image's N voxels; ``include_background=True`` keeps class 0; ``metric_reduction="none"`` returns that
    B x C matrix and ``"mean"`` its mean. mcseg: ``case_calibration(...).values["class_ece"][c]`` is the same
    quantity for one case over the region "all" (every voxel; bins (lo, hi] on the exact edges b/M, which
    differ from MONAI's float32 edges only for a value within ~1e-7 of an edge), and ``classwise_ece``
    = its mean over the K classes. So per case: mcseg classwise_ece = the mean over c of MONAI's row b, and
    the mean over cases = MONAI's ``"mean"`` aggregate (every case has the same C). NOT compared: mcseg's
    pooled value (``CalibrationMetric.aggregate``, the ECE of the summed bins of all cases) is not a mean of
    per-case values, and MONAI has no counterpart of it. 20 random cases (2D and 3D, 2 to 5 classes,
    batches of 1 to 3 images); measured largest difference 5.8e-8 (the issue measured 2.9e-7 on its cases; MONAI
    sums in float32).
    """
    from monai.metrics import CalibrationErrorMetric

    worst, seed = 0.0, 100
    for k, shape, batch in [(2, (17, 13), 3), (3, (9, 8, 7), 2), (4, (31, 29), 1), (5, (6, 7, 8), 3),
                            (3, (40, 12), 2), (4, (5, 9, 11), 3), (2, (10, 10, 10), 1), (5, (23, 19), 2),
                            (3, (12, 12), 3)]:
        cases = [random_probs(k, shape, seed=(seed := seed + 1), scale=3.0) for _ in range(batch)]
        probs = torch.stack([p for p, _ in cases])
        onehot = torch.stack([torch.nn.functional.one_hot(y, k).movedim(-1, 0).float() for _, y in cases])
        metric = CalibrationErrorMetric(num_bins=20, include_background=True, calibration_reduction="expected",
                                        metric_reduction="none")
        metric(y_pred=probs, y=onehot)
        theirs = metric.aggregate()  # B x C
        ours = [case_calibration(p, y, n_bins=20).values for p, y in cases]
        for b, v in enumerate(ours):
            np.testing.assert_allclose(v["class_ece"], theirs[b].numpy(), atol=1e-6)
            worst = max(worst, abs(v["classwise_ece"] - theirs[b].mean().item()))
        mean_metric = CalibrationErrorMetric(num_bins=20, metric_reduction="mean")
        mean_metric(y_pred=probs, y=onehot)
        assert np.mean([v["classwise_ece"] for v in ours]) == pytest.approx(mean_metric.aggregate().item(), abs=1e-6)
    assert seed - 100 == 20  # cases compared
    assert worst < 1e-6


def test_per_case_sums_equal_pooled_values():
    metric = CalibrationMetric(num_classes=3, n_bins=15)
    cases = [random_probs(3, shape, seed=s) for s, shape in enumerate([(5, 6, 7), (9, 4), (3, 3, 3)])]
    masks = [torch.rand(p.shape[1:], generator=torch.Generator().manual_seed(9)) < 0.7 for p, _ in cases]
    for (p, y), m in zip(cases, masks):
        metric(p, y, m)
    pooled = metric.aggregate()
    all_p = torch.cat([p[:, m] for (p, _), m in zip(cases, masks)], 1)
    all_y = torch.cat([y[m] for (_, y), m in zip(cases, masks)])
    direct = case_calibration(all_p, all_y).values
    for key in (*KEYS, "n_voxels"):
        assert pooled[key] == pytest.approx(direct[key], abs=1e-12), key
    np.testing.assert_allclose(pooled["class_ece"], direct["class_ece"], atol=1e-12)
    # pooled adaptive ECE: approximated from the fine histogram, within its stated bound
    assert abs(pooled["adaptive_ece"] - direct["adaptive_ece"]) <= pooled["adaptive_ece_max_error"] + 1e-12
    metric.reset()
    assert len(metric) == 0 and math.isnan(metric.aggregate()["ece"])


def test_perfectly_calibrated_predictor_has_ece_within_sampling_error():
    # labels drawn from the predicted distribution itself: the true calibration error is 0 and the
    # estimate only carries sampling noise. In bin b, acc_b - conf_b has mean 0 and standard
    # deviation s_b = sqrt(mean r(1 - r) / n_b), so E[ECE] <= sum_b n_b/N s_b (about 0.8 of it
    # for Gaussian noise).
    g = torch.Generator().manual_seed(7)
    n, k, m = 200_000, 4, 15
    probs = torch.softmax(torch.randn(k, n, generator=g) * 1.5, 0)
    label = torch.multinomial(probs.T, 1, generator=g)[:, 0]
    v = case_calibration(probs, label, n_bins=m).values
    conf = probs.max(0).values.double().numpy()
    bins = bins_reference(conf, m)
    expected = sum(math.sqrt((conf[bins == b] * (1 - conf[bins == b])).mean() * (bins == b).sum()) / n
                   for b in range(m) if (bins == b).any())
    assert 0.3 * expected < v["ece"] < 1.5 * expected
    # the same predictor made overconfident is detected far above the noise
    sharp = torch.softmax(torch.log(probs) * 3, 0)
    assert case_calibration(sharp, label, n_bins=m).values["ece"] > 20 * expected


def test_half_precision_is_computed_in_float32():
    probs, label = random_probs(3, (8, 8), seed=8)
    v16 = case_calibration(probs.half(), label).values
    v32 = case_calibration(probs.half().float(), label).values
    assert v16["ece"] == v32["ece"] and v16["brier"] == v32["brier"]


def test_stats_add_is_associative_and_zero_is_neutral():
    a = case_calibration(*random_probs(3, (5, 5), seed=10)).stats
    b = case_calibration(*random_probs(3, (6, 5), seed=11)).stats
    z = CalibrationStats.zeros(3, 15)
    assert (z + a + b).values()["ece"] == pytest.approx((a + b).values()["ece"], abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(2, 5), n=st.integers(1, 60), n_bins=st.integers(1, 20), seed=st.integers(0, 10_000),
       scale=st.floats(0.1, 20))
def test_property_calibration_values_are_bounded(k, n, n_bins, seed, scale):
    probs, label = random_probs(k, (n,), seed=seed, scale=scale)
    v = case_calibration(probs, label, n_bins=n_bins).values
    for key in ("ece", "mce", "classwise_ece", "adaptive_ece"):
        assert 0.0 <= v[key] <= 1.0 + 1e-12, key
    assert v["ece"] <= v["mce"] + 1e-12  # a weighted mean never exceeds the max
    assert 0.0 <= v["brier"] <= 2.0 + 1e-9 and v["nll"] >= 0.0


@pytest.mark.cuda
def test_cuda_matches_cpu():
    probs, label = random_probs(4, (20, 20, 20), seed=12)
    cpu = case_calibration(probs, label).values
    gpu = case_calibration(probs.cuda(), label.cuda()).values
    for key in (*KEYS, "adaptive_ece"):
        assert gpu[key] == pytest.approx(cpu[key], abs=1e-9), key


def test_chunked_accumulation_equals_one_pass(monkeypatch):
    import mcseg.metrics.calibration as calibration

    probs, label = random_probs(5, (13, 11, 7), seed=13)
    mask = torch.rand(13, 11, 7, generator=torch.Generator().manual_seed(14)) < 0.6
    whole = case_calibration(probs, label, mask=mask).values
    monkeypatch.setitem(calibration.CHUNK_VOXELS, "cpu", 97)  # 11 chunks, the last one partial
    chunked = case_calibration(probs, label, mask=mask).values
    for key in (*KEYS, "adaptive_ece", "n_voxels"):
        assert chunked[key] == pytest.approx(whole[key], abs=1e-12), key
    np.testing.assert_allclose(chunked["class_ece"], whole["class_ece"], atol=1e-12)

"""Figures against several raters: hand-derived small cases and an independent formulation each (MONAI for
CURVAS's row Dice, torchmetrics for its ECE, scipy's linear_sum_assignment for the matching, scipy's quad for
the CRPS, a plain loop for the GED)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mcseg.metrics.calibration import case_calibration
from mcseg.metrics.rater_calibration import curvas2024_crop, curvas2025_crop, curvas_ece, soft_calibration
from mcseg.metrics.raters import (
    CURVAS2025_THRESHOLDS, QUBIQ_THRESHOLDS, consensus_dice, curvas_row_dice, per_rater_dice, per_rater_hd,
    rater_mean, thresholded_dice, thresholds_of,
)
from mcseg.metrics.samples import generalised_energy_distance, hungarian_matched_iou, linear_assignment
from mcseg.metrics.volume import crps_curvas_code, crps_normal, rater_volumes, volume_crps


def _random_case(seed: int, shape=(5, 6, 7), k: int = 3, c: int = 3):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, c, shape, generator=g)
    raters = torch.stack([torch.where(torch.rand(shape, generator=g) < 0.25, torch.randint(0, c, shape, generator=g),
                                      base) for _ in range(k)])
    probs = torch.softmax(3 * torch.randn((c, *shape), generator=g), 0)
    return probs, raters


# ----------------------------------------------------------------------------- overlap
def test_rater_mean_and_per_rater_dice_by_hand():
    raters = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])
    assert rater_mean(raters, 2)[1].tolist() == [0.0, 1.0, 0.5, 0.0]
    d = per_rater_dice(torch.tensor([0, 1, 1, 0]), raters, 2)
    assert d[:, 1].tolist() == pytest.approx([1.0, 2 / 3])
    hd = per_rater_hd(torch.tensor([[0, 1, 1, 0]]).T.repeat(1, 3), raters[:, :, None].repeat(1, 1, 3), 2, (2.0, 1.0))
    assert hd[:, 1].tolist() == [0.0, 2.0]  # rater 2 lacks the third row: 2 mm away


def test_consensus_dice_by_hand():
    pred = torch.tensor([1, 1, 1, 0, 0])
    raters = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 0, 0, 1]])
    # F = [1 0 0 0 1], dissensus = [0 1 0 0 0]; prediction outside it = [1 0 1 0 0]: 2 * 1 / (2 + 2)
    assert consensus_dice(pred, raters, 2).tolist()[1] == 0.5
    assert math.isnan(consensus_dice(pred, raters, 2)[0])


def _monai_curvas(pred, raters, k):
    from monai.metrics import DiceMetric

    full = (raters == k).all(0)
    dissensus = (raters == k).any(0) & ~full
    p = ((pred == k) & ~dissensus).permute(2, 1, 0).float()  # SimpleITK's (z, y, x) of a NIfTI (x, y, z) array
    metric = DiceMetric(include_background=False, reduction="mean", ignore_empty=True)
    metric(p, full.permute(2, 1, 0).float())  # 3D arrays without batch or channel axes, as CURVAS 2024 passes them
    return float(metric.aggregate().item())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_curvas_row_dice_is_what_monai_returns_on_curvas_arrays(seed):
    probs, raters = _random_case(seed, shape=(6, 5, 4))
    pred = probs.argmax(0)
    ours = curvas_row_dice(pred, raters, 3)
    for k in (1, 2):
        assert ours[k].item() == pytest.approx(_monai_curvas(pred, raters, k), abs=1e-6)
    assert ours[1] != pytest.approx(consensus_dice(pred, raters, 3)[1].item())  # not the 3D Dice


def test_curvas_row_dice_by_hand():
    # one slice (z), rows y = 0, 1: row 0 is dropped; row 1 Dice along x of [1 1 0] vs [1 0 0] = 2/3
    raters = torch.zeros(2, 3, 2, 1, dtype=torch.long)
    raters[:, 0, 1, 0] = 1
    raters[:, :, 0, 0] = 1  # row 0: perfect agreement, not scored
    pred = torch.zeros(3, 2, 1, dtype=torch.long)
    pred[:2, 1, 0] = 1
    assert curvas_row_dice(pred, raters, 2)[1].item() == pytest.approx(2 / 3)


def test_thresholded_dice_by_hand():
    raters = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])  # mean: 1 .5 0 0
    probs = torch.tensor([[0.1, 0.6, 0.8, 1.0], [0.9, 0.4, 0.2, 0.0]])
    # t=.3: both [1 1 0 0] -> 1; t=.6: both [1 0 0 0] -> 1; t=.95: prediction empty, reference [1 0 0 0] -> 0
    assert thresholded_dice(probs, raters, 2, [0.3, 0.6, 0.95])[1].item() == pytest.approx(2 / 3)
    assert thresholded_dice(probs, raters, 2, [0.99])[1].item() == 0.0
    assert thresholded_dice(torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.zeros(2, 2, dtype=torch.long), 2,
                            "qubiq")[1].item() == 1.0  # both empty at every threshold
    assert QUBIQ_THRESHOLDS == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert CURVAS2025_THRESHOLDS == pytest.approx([0.1, 0.24, 0.38, 0.52, 0.66, 0.8])
    assert thresholds_of("curvas2025") == CURVAS2025_THRESHOLDS
    with pytest.raises(ValueError, match="thresholds=\\[1.5\\]"):
        thresholds_of([1.5])
    # five raters all marking a voxel: 1.0 > 0.8; four: 0.8 > 0.8 is false
    five = torch.tensor([[1, 1]] * 4 + [[1, 0]])
    assert thresholded_dice(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), five, 2, [0.8])[1].item() == 1.0


# ----------------------------------------------------------------------------- calibration
def test_soft_calibration_by_hand():
    probs = torch.tensor([[0.2, 0.7], [0.8, 0.3]])
    raters = torch.tensor([[1, 0], [0, 0]])  # m1 = .5 0, m0 = .5 1
    v = soft_calibration(probs, raters, n_bins=10).values()
    # conf .8 (pred 1, observed .5), .7 (pred 0, observed 1): bins 7 and 6 -> (.3 + .3) / 2
    assert v["ece_mean"] == pytest.approx(0.3)
    # NLL: -(.5 log .2 + .5 log .8 + log .7) / 2
    assert v["nll_mean"] == pytest.approx(-(0.5 * math.log(0.2) + 0.5 * math.log(0.8) + math.log(0.7)) / 2)
    assert v["brier_mean"] == pytest.approx(((0.3 ** 2) * 2 + (0.3 ** 2) * 2) / 2)


def test_soft_nll_floors_a_probability_of_zero():
    # voxel 1: p = (1, 0), raters 0 and 1 (m = .5 .5): -.5 log 1 - .5 log 1e-12; voxel 2: p = (0, 1), both raters 1
    # (m = 0 1): the class of p = 0 has m = 0 and adds nothing (0 log 0 = NaN without the floor)
    probs = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    raters = torch.tensor([[0, 1], [1, 1]])
    v = soft_calibration(probs, raters).values()
    assert v["nll_mean"] == pytest.approx(0.5 * -math.log(1e-12) / 2, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_soft_calibration_with_one_rater_is_the_usual_calibration(seed):
    probs, raters = _random_case(seed, k=1)
    soft = soft_calibration(probs, raters, n_bins=15).values()
    hard = case_calibration(probs, raters[0], n_bins=15).values
    for key in ("ece", "classwise_ece", "nll", "brier"):
        assert soft[f"{key}_mean"] == pytest.approx(hard[key], abs=1e-9)


def test_soft_nll_is_the_mean_of_the_raters_nll_but_brier_is_not():
    probs, raters = _random_case(3, k=4)
    soft = soft_calibration(probs, raters).values()
    each = [case_calibration(probs, r).values for r in raters]
    assert soft["nll_mean"] == pytest.approx(np.mean([v["nll"] for v in each]), rel=1e-9)
    m = rater_mean(raters, 3, torch.float64)
    variance = float((m * (1 - m)).sum(0).mean())
    assert soft["brier_mean"] == pytest.approx(np.mean([v["brier"] for v in each]) - variance, rel=1e-9)
    pooled = soft_calibration(probs[..., :3], raters[..., :3]) + soft_calibration(probs[..., 3:], raters[..., 3:])
    assert pooled.values()["ece_mean"] == pytest.approx(soft["ece_mean"], abs=1e-12)


@pytest.mark.parametrize("edition", [2024, 2025])
def test_curvas_ece_is_torchmetrics_per_rater(edition):
    from torchmetrics.classification import MulticlassCalibrationError

    c = 4 if edition == 2024 else 2
    probs, raters = _random_case(4, k=3 if edition == 2024 else 5, c=c)
    probs[:, 0, 0, 0] = torch.nn.functional.one_hot(torch.tensor(c - 1), c).float()  # a confidence of exactly 1
    got = curvas_ece(probs, raters, edition=edition)
    fg = probs[1:].reshape(c - 1, -1).double()
    p = torch.cat([1 - fg.sum(0, keepdim=True), fg]) if edition == 2024 else torch.cat([1 - fg, fg]).clamp_min(1e-8)
    p = p / p.sum(0, keepdim=True) if edition == 2025 else p
    expected = []
    for r in raters:
        metric = MulticlassCalibrationError(num_classes=c, n_bins=50, norm="l1")
        expected.append(float(metric(p.T, r.reshape(-1))))
    assert got["ece_per_rater"] == pytest.approx(expected, abs=1e-6)
    assert got["ece_rater_mean"] == pytest.approx(np.mean(expected), abs=1e-6)


def test_curvas_ece_softmaxes_when_the_background_goes_negative():
    from torchmetrics.classification import MulticlassCalibrationError

    probs, raters = _random_case(5, k=3, c=4)
    probs[1:, 0, 0, 0] = torch.tensor([0.5, 0.3, 0.2 + 1e-6])  # 1 - sum < 0: torchmetrics softmaxes every row
    got = curvas_ece(probs, raters)
    fg = probs[1:].reshape(3, -1).double()
    p = torch.cat([1 - fg.sum(0, keepdim=True), fg])
    metric = MulticlassCalibrationError(num_classes=4, n_bins=50, norm="l1")
    assert got["ece_per_rater"][0] == pytest.approx(float(metric(p.T, raters[0].reshape(-1))), abs=1e-6)


def test_curvas_crops():
    image = torch.full((6, 7, 3), -1000.0)
    image[2:5, 1:4, 1] = 40.0
    assert curvas2024_crop(image) == (slice(2, 5), slice(1, 4), slice(None))
    raters = torch.zeros(2, 30, 8, 8, dtype=torch.long)
    raters[0, 25, 3, 4] = 1
    raters[1, 5, 3, 4] = 1
    box = curvas2025_crop(raters)  # the evaluator relies on the default: CURVAS 2025's margin of 20 voxels
    assert box == (slice(-15, 45), slice(-17, 23), slice(-16, 24))
    assert curvas2025_crop(raters, margin=2) == (slice(3, 27), slice(1, 5), slice(2, 6))
    # -15 wraps to 15 (only the last 15 slices), -17 before the start of 8 clamps to 0: as numpy slices
    assert raters[0][box].shape == (15, 8, 8) == raters[0].numpy()[box].shape
    with pytest.raises(ValueError, match="every rater's map is empty"):
        curvas2025_crop(torch.zeros(2, 4, 4, dtype=torch.long))


# ----------------------------------------------------------------------------- volume CRPS
@pytest.mark.parametrize("mu,sigma,value", [(100.0, 10.0, 93.0), (100.0, 10.0, 180.0), (50.0, 4.0, 50.0)])
def test_crps_against_quad(mu, sigma, value):
    from scipy.integrate import quad
    from scipy.stats import norm

    exact = quad(lambda y: norm.cdf(y, mu, sigma) ** 2, -np.inf, value)[0] + \
        quad(lambda y: (1 - norm.cdf(y, mu, sigma)) ** 2, value, np.inf)[0]
    assert crps_normal(mu, sigma, value) == pytest.approx(exact, rel=1e-7)
    grid = np.linspace(norm.ppf(0.01, mu, sigma), norm.ppf(0.99, mu, sigma), 100)

    def curvas_f(y):
        return 0.0 if y < grid[0] else 1.0 if y > grid[-1] else float(np.interp(y, grid, norm.cdf(grid, mu, sigma)))

    lo, hi = mu - 3 * sigma, mu + 3 * sigma
    knots = sorted({lo, hi, *[g for g in grid if lo < g < hi], *([value] if lo < value < hi else [])})
    coded = sum(quad(lambda y: (curvas_f(y) - (y > value)) ** 2, a, b, epsabs=1e-12)[0]
                for a, b in zip(knots[:-1], knots[1:]))
    assert crps_curvas_code(mu, sigma, value) == pytest.approx(coded, rel=1e-7)


def test_crps_quirks_by_hand():
    assert crps_normal(10.0, 0.0, 13.0) == 3.0  # a point mass: |V_hat - mu|
    assert crps_curvas_code(10.0, 0.0, 13.0) == 0.0  # the code's empty interval
    far, farther = crps_curvas_code(100.0, 10.0, 200.0), crps_curvas_code(100.0, 10.0, 900.0)
    assert far == farther  # truncated to mu +- 3 sigma: saturates
    assert crps_normal(100.0, 10.0, 900.0) > crps_normal(100.0, 10.0, 200.0)


def test_volume_crps_from_maps():
    raters = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])  # volumes 3 2 1 voxels; class 2 absent
    assert rater_volumes(raters, 3, 0.5)[:, 1].tolist() == [1.5, 1.0, 0.5]
    assert rater_volumes(raters, 3)[:, 2].tolist() == [0.0, 0.0, 0.0]
    probs = torch.tensor([[0.0, 0.5, 0.5, 1.0], [1.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = volume_crps(probs, raters, voxel_volume=2.0)
    assert out["volume_predicted"][1] == 4.0 and out["volume_rater_mean"][1] == 4.0
    assert out["volume_rater_std"][1] == pytest.approx(2 * math.sqrt(2 / 3))
    assert out["volume_crps"][1] == pytest.approx(crps_normal(4.0, 2 * math.sqrt(2 / 3), 4.0))
    assert out["volume_crps"][2] == 0.0 and math.isnan(out["volume_crps"][0])


# ----------------------------------------------------------------------------- samples
def _distance(a: np.ndarray, b: np.ndarray, c: int) -> float:
    ious = []
    for k in range(1, c):
        inter, union = np.sum((a == k) & (b == k)), np.sum((a == k) | (b == k))
        ious.append(1.0 if union == 0 else inter / union)
    return 1.0 - float(np.mean(ious))


def test_ged_by_hand():
    samples = torch.tensor([[1, 1, 0, 0]])
    raters = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    # cross (0 + 1) / 2, within samples 0, within raters (0 + 1 + 1 + 0) / 4: 2 * .5 - 0 - .5
    out = generalised_energy_distance(samples, raters, 2)
    assert out == {"ged": pytest.approx(0.5), "diversity": 0.0, "n_samples": 1}
    empty = torch.zeros(2, 4, dtype=torch.long)
    assert generalised_energy_distance(empty, empty, 2)["ged"] == 0.0  # IoU of two empty masks is 1


def test_ged_and_hm_iou_against_loops_and_scipy():
    from scipy.optimize import linear_sum_assignment

    g = torch.Generator().manual_seed(7)
    samples = torch.randint(0, 3, (6, 5, 5), generator=g)
    raters = torch.randint(0, 3, (4, 5, 5), generator=g)
    s, y = samples.numpy(), raters.numpy()
    d = lambda a, b: _distance(a, b, 3)  # noqa: E731
    ged = (2 * np.mean([[d(a, b) for b in y] for a in s]) - np.mean([[d(a, b) for b in s] for a in s])
           - np.mean([[d(a, b) for b in y] for a in y]))
    assert generalised_energy_distance(samples, raters, 3)["ged"] == pytest.approx(ged, abs=1e-12)
    size = 12  # lcm(6, 4)
    cost = np.array([[d(y[a // 3], s[b // 2]) for b in range(size)] for a in range(size)])
    rows, cols = linear_sum_assignment(cost)
    assert hungarian_matched_iou(samples, raters, 3) == pytest.approx(np.mean(1 - cost[rows, cols]), abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 7, 25])
def test_linear_assignment_is_optimal(n):
    from scipy.optimize import linear_sum_assignment

    rng = np.random.default_rng(n)
    for cost in (rng.random((n, n)), rng.integers(0, 3, (n, n)).astype(float)):  # ties too
        cols = linear_assignment(cost)
        assert sorted(cols) == list(range(n))
        rows, best = linear_sum_assignment(cost)
        assert cost[np.arange(n), cols].sum() == pytest.approx(cost[rows, best].sum(), abs=1e-12)

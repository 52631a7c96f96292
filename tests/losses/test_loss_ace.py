"""mL1-ACE (hard and soft binning, with CE / Dice): hand values, the authors' per-image-and-class loop
re-derived, MONAI's Dice and average calibration error, the presets, empty classes, gradients."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from .loss_zoo import random_inputs
from ..conftest import CONFIG_DIR
from mcseg.losses import L1ACELoss
from mcseg.losses.ace import binned_calibration, l1_ace

ACE_ONLY = {"lambda_ace": 1.0, "lambda_ce": 0.0}


def two_class_logits(p1):
    """1 x 2 x N float64 logits whose class-1 probabilities are ``p1`` (a list per image)."""
    p = torch.tensor(p1, dtype=torch.float64)
    return torch.stack([torch.zeros_like(p), torch.log(p / (1 - p))], dim=1)


# image 0: p1 = .22 .24 .71 .93, y = 0 1 1 0; image 1: p1 = .12 .12 .33 .33, all background (class 1 empty)
HARD_P1 = [[0.22, 0.24, 0.71, 0.93], [0.12, 0.12, 0.33, 0.33]]
HARD_Y = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]])
# image 0, class 1, bins of width 1/20: (.2, .25] {.22, .24}: |.23 - .5|; (.7, .75] {.71}: |.71 - 1|; (.9, .95] {.93}: .93
# class 0 is the mirror image (p0 = 1 - p1, y0 = 1 - y1): the same three gaps
F_IMAGE0 = (0.27 + 0.29 + 0.93) / 3
# image 1: class 1 (.1, .15] {.12, .12}: .12; (.3, .35] {.33, .33}: .33; class 0 (p0 .88, .67, y0 = 1): the same
F_IMAGE1 = (0.12 + 0.33) / 2


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, (2 * F_IMAGE0 + F_IMAGE1 + 0.0) / 4),  # authors: the empty class is zeroed, still counted
        ({"empty_classes": "exclude"}, (2 * F_IMAGE0 + F_IMAGE1) / 3),
        ({"empty_classes": "keep"}, (2 * F_IMAGE0 + 2 * F_IMAGE1) / 4),
        ({"include_background": False}, (F_IMAGE0 + 0.0) / 2),
        ({"include_background": False, "empty_classes": "exclude"}, F_IMAGE0),
    ],
)
def test_hard_hand_values(kwargs, expected):
    loss = L1ACELoss(**ACE_ONLY, **kwargs)
    assert loss(two_class_logits(HARD_P1), HARD_Y).item() == pytest.approx(expected, rel=1e-9)


def test_hard_gradient_is_sign_over_nonempty_bins_times_count():
    """d f / d p_v = sign(mean_p_k - mean_y_k) / (K_non-empty n_k): image 0, class 1 (three non-empty bins)."""
    p1 = torch.tensor([HARD_P1[0]], dtype=torch.float64)
    probs = torch.stack([1 - p1, p1], dim=1).requires_grad_(True)  # 1 x 2 x 4
    truth = F.one_hot(HARD_Y[:1], 2).movedim(-1, 1).double()
    mean_p, mean_y, count = binned_calibration(probs, truth, None, 20, "hard", 0.01)
    assert count[0, 1].nonzero().flatten().tolist() == [4, 14, 18]
    l1_ace(mean_p, mean_y)[0, 1].backward()
    # .22, .24 in a bin of 2 below its truth (-1 / (3 * 2)); .71 below (-1/3); .93 above (+1/3)
    assert probs.grad[0, 1].tolist() == pytest.approx([-1 / 6, -1 / 6, -1 / 3, 1 / 3], rel=1e-12)
    assert probs.grad[0, 0].abs().sum() == 0


def test_soft_hand_value():
    """K = 2: centres 1/4 and 3/4; p1 = .1 .5 .6 .9, y = 0 1 0 1 (class 0 is the mirror image)."""
    logits, target = two_class_logits([[0.1, 0.5, 0.6, 0.9]]), torch.tensor([[0, 1, 0, 1]])
    # weights on (bin 0, bin 1): .1 -> (1, 0) (below the first centre); .5 -> (.5, .5); .6 -> (.3, .7); .9 -> (0, 1)
    # bin 0: W = 1.8, sum w p = .1 + .25 + .18 = .53, sum w y = .5; bin 1: W = 2.2, sum w p = 1.57, sum w y = 1.5
    expected = (0.03 / 1.8 + 0.07 / 2.2) / 2
    loss = L1ACELoss(binning="soft", num_bins=2, **ACE_ONLY)
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-6)  # centres carry (1 + eps_f32)


def test_soft_bins_lighter_than_empty_weight_are_empty():
    # K = 2; p1 = .255 (y = 1) puts weight .99 on bin 0 and .01 on bin 1; p1 = .1 (y = 0) all on bin 0
    logits, target = two_class_logits([[0.255, 0.1]]), torch.tensor([[1, 0]])
    bin0 = abs(0.99 * 0.255 + 0.1 - 0.99) / 1.99  # weighted means of p and of y in bin 0
    values = {w: L1ACELoss(binning="soft", num_bins=2, empty_weight=w, **ACE_ONLY)(logits, target).item()
              for w in (0.005, 0.02)}
    # class 0 is the mirror image (same gaps); with the threshold .02 bin 1 (weight .01) is empty
    assert values[0.005] == pytest.approx((bin0 + 0.745) / 2, rel=1e-5)
    assert values[0.02] == pytest.approx(bin0, rel=1e-5)


# ------------------------------------------------------------------ the authors' loops, re-derived
def authors_hard_bins(probs, truth, num_bins):
    """Per image and class (Python loops, as the authors' ``hard_binned_calibration``): bucketize on
    linspace(0, 1 + eps_f32) edges, scatter_reduce mean without self; empty bins NaN."""
    b_size, c_size = probs.shape[:2]
    edges = torch.linspace(0.0, 1.0 + torch.finfo(torch.float32).eps, num_bins + 1)
    p, y = probs.flatten(2).float(), truth.flatten(2).float()
    mean_p = torch.zeros(b_size, c_size, num_bins)
    mean_y, count = torch.zeros_like(mean_p), torch.zeros_like(mean_p)
    for b in range(b_size):
        for c in range(c_size):
            idx = torch.bucketize(p[b, c], edges[1:], right=False)
            count[b, c] = torch.zeros(num_bins).scatter_add(0, idx, torch.ones_like(p[b, c]))
            mean_p[b, c] = torch.zeros(num_bins).scatter_reduce(0, idx, p[b, c], "mean", include_self=False)
            mean_y[b, c] = torch.zeros(num_bins).scatter_reduce(0, idx, y[b, c], "mean", include_self=False)
    empty = count == 0
    return mean_p.masked_fill(empty, math.nan), mean_y.masked_fill(empty, math.nan)


def authors_soft_bins(probs, truth, num_bins, empty_weight=0.01):
    """Per image and class: half-bin bucketize, +-10000 sentinels, left/right weights by distance
    (the authors' ``soft_binned_calibration`` construction)."""
    b_size, c_size = probs.shape[:2]
    half = torch.linspace(0.0, 1.0 + torch.finfo(torch.float32).eps, 2 * num_bins + 1)
    centres = half[1::2]
    padded = torch.cat([torch.tensor([-10000.0]), centres.repeat_interleave(2), torch.tensor([10000.0])])
    p, y = probs.flatten(2).float(), truth.flatten(2).float()
    mean_p = torch.zeros(b_size, c_size, num_bins)
    mean_y, weight = torch.zeros_like(mean_p), torch.zeros_like(mean_p)
    for b in range(b_size):
        for c in range(c_size):
            j = torch.bucketize(p[b, c], half[1:], right=False)
            left, right = (j - 1).clamp(min=0) // 2, (j + 1).clamp(max=2 * num_bins - 1) // 2
            d_left, d_right = p[b, c] - padded[j], padded[j + 2] - p[b, c]
            w_left, w_right = d_right / (d_left + d_right), d_left / (d_left + d_right)

            def spread(v):
                return (torch.zeros(num_bins).scatter_add(0, left, w_left * v)
                        + torch.zeros(num_bins).scatter_add(0, right, w_right * v))

            total = spread(torch.ones_like(p[b, c]))
            weight[b, c], mean_p[b, c], mean_y[b, c] = total, spread(p[b, c]) / total, spread(y[b, c]) / total
    empty = weight < empty_weight
    return mean_p.masked_fill(empty, math.nan), mean_y.masked_fill(empty, math.nan)


def authors_ace(logits, target, binning, ignore_empty_classes=True, include_background=True, num_bins=20):
    probs = torch.softmax(logits, 1)
    truth = F.one_hot(target, logits.shape[1]).movedim(-1, 1).to(probs.dtype)
    if not include_background:
        probs, truth = probs[:, 1:], truth[:, 1:]
    bins = authors_hard_bins if binning == "hard" else authors_soft_bins
    f = torch.nanmean((torch.sub(*bins(probs, truth, num_bins))).abs(), dim=-1)
    if ignore_empty_classes:
        f = f * (truth.flatten(2).sum(-1) > 0).float()
    return f.mean()


SHAPES = [(2, 4, 9, 7), (2, 3, 5, 4, 6)]


@pytest.mark.parametrize("binning", ["hard", "soft"])
@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d"])
def test_equals_the_authors_loops_value_and_gradient(binning, shape):
    logits, target = random_inputs(shape, seed=21, scale=2.0)
    target[0] = target[0].clamp(max=1)  # image 0 lacks the upper classes: the empty-class path is exercised
    for include_background in (True, False):
        for empty in ("zero", "keep"):
            ours_z, theirs_z = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
            loss = L1ACELoss(binning=binning, empty_classes=empty, include_background=include_background, **ACE_ONLY)
            ours = loss(ours_z, target)
            theirs = authors_ace(theirs_z, target, binning, empty == "zero", include_background)
            assert ours.item() == pytest.approx(theirs.item(), abs=2e-7), (include_background, empty)
            ours.backward()
            theirs.backward()
            torch.testing.assert_close(ours_z.grad, theirs_z.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d"])
def test_hard_ace_equals_monai_average_calibration_error(shape):
    """MONAI 1.6's CalibrationErrorMetric(calibration_reduction="average") is the same per (image, class)
    nanmean over the non-empty bins of |mean p - mean y| (its bins: the same float32 edges, bucketize);
    its mean over (B, C) is our ACE term with empty_classes="keep"."""
    from monai.metrics import CalibrationErrorMetric

    logits, target = random_inputs(shape, seed=22, scale=2.0)
    probs = torch.softmax(logits, 1)
    onehot = F.one_hot(target, shape[1]).movedim(-1, 1).float()
    theirs = CalibrationErrorMetric(num_bins=20, calibration_reduction="average")(probs, onehot)
    ours = L1ACELoss(empty_classes="keep", **ACE_ONLY)(logits, target)
    assert ours.item() == pytest.approx(theirs.mean().item(), abs=1e-7)


# ------------------------------------------------------------------ the presets
def preset(name):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return instantiate(compose(config_name="train", overrides=[f"loss={name}"]).loss)


@pytest.mark.parametrize("binning", ["hard", "soft"])
@pytest.mark.parametrize("combination", ["ce", "dice", "dice_ce"])
def test_presets_are_the_authors_combinations(binning, combination):
    """configs/loss/{hard,soft}l1ace_{ce,dice,dice_ce}.yaml: ACE with nn.CrossEntropyLoss and/or MONAI's DiceLoss
    at the authors' bundle-template weights and Dice settings (0.5 + 0.5; 0.33 x 3 with squared_pred)."""
    from monai.losses import DiceLoss

    loss = preset(f"{binning}l1ace_{combination}")
    assert isinstance(loss, L1ACELoss) and loss.binning == binning and loss.num_bins == 20
    logits, target = random_inputs((2, 4, 8, 6), seed=23, scale=2.0, dtype=torch.float64)
    ace = authors_ace(logits, target, binning).double()
    ce = F.cross_entropy(logits, target)
    y = target.unsqueeze(1)
    dice = DiceLoss(include_background=True, softmax=True, to_onehot_y=True)(logits, y)
    dice_sq = DiceLoss(include_background=True, softmax=True, to_onehot_y=True, squared_pred=True, smooth_nr=0,
                       smooth_dr=1e-5)(logits, y)
    expected = {"ce": 0.5 * ace + 0.5 * ce, "dice": 0.5 * ace + 0.5 * dice,
                "dice_ce": 0.33 * ace + 0.33 * dice_sq + 0.33 * ce}[combination]
    assert loss(logits, target).item() == pytest.approx(expected.item(), abs=1e-6)  # their ACE: float32


# ------------------------------------------------------------------ ignored voxels, limits, arguments
def test_ignored_voxels_leave_the_bins_and_the_presence_test():
    logits, target = random_inputs((2, 3, 6, 5), seed=24)
    ignored = target.clone()
    ignored[1] = torch.where(target[1] == 2, 255, target[1])  # class 2 of image 1 is now only ignored voxels
    # image by image on the kept voxels alone: image 1 has classes 0 and 1, class 2 is absent once ignored
    loss = L1ACELoss(binning="soft", ignore_index=255, **ACE_ONLY)
    f = []
    for b in range(2):
        keep = ignored[b] != 255
        z, t = logits[b].movedim(0, -1)[keep].T[None], ignored[b][keep][None]
        probs = torch.softmax(z, 1)
        truth = F.one_hot(t, 3).movedim(-1, 1).float()
        f.append(l1_ace(*binned_calibration(probs, truth, None, 20, "soft", 0.01)[:2])[0])
    f = torch.stack(f)
    present = torch.tensor([[True, True, True], [True, True, False]])
    assert loss(logits, ignored).item() == pytest.approx((f * present).sum().item() / 6, rel=1e-6)
    exclude = L1ACELoss(binning="soft", ignore_index=255, empty_classes="exclude", **ACE_ONLY)
    assert exclude(logits, ignored).item() == pytest.approx((f * present).sum().item() / 5, rel=1e-6)


def test_weights_combine_the_terms():
    logits, target = random_inputs((2, 3, 5, 5), seed=25)
    ace = L1ACELoss(**ACE_ONLY)(logits, target)
    ce = F.cross_entropy(logits, target)
    both = L1ACELoss(lambda_ace=0.2, lambda_ce=0.7)(logits, target)
    assert both.item() == pytest.approx(0.2 * ace.item() + 0.7 * ce.item(), rel=1e-6)
    assert L1ACELoss(lambda_ace=0.0, lambda_ce=1.0)(logits, target).item() == pytest.approx(ce.item(), rel=1e-6)


@pytest.mark.parametrize("binning", ["hard", "soft"])
def test_perfect_one_hot_prediction_has_zero_ace(binning):
    target = torch.randint(0, 3, (2, 4, 4, 3), generator=torch.Generator().manual_seed(26))
    logits = F.one_hot(target, 3).movedim(-1, 1).double() * 60.0
    assert L1ACELoss(binning=binning, **ACE_ONLY)(logits, target).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("binning", ["hard", "soft"])
@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d"])
def test_gradients_are_finite_with_saturated_and_empty_bins(binning, shape):
    logits, target = random_inputs(shape, seed=27, scale=30.0)  # most probabilities at 0 or 1: most bins empty
    logits.requires_grad_(True)
    L1ACELoss(binning=binning, lambda_dice=0.3)(logits, target).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"binning": "medium"}, "binning.*'medium'"),
        ({"num_bins": 1}, "num_bins.*1"),
        ({"num_bins": 20.0}, "num_bins.*20.0"),
        ({"lambda_ace": -0.5}, "lambda_ace.*-0.5"),
        ({"lambda_ce": "half"}, "lambda_ce.*'half'"),
        ({"lambda_dice": math.nan}, "lambda_dice.*nan"),
        ({"empty_classes": True}, "empty_classes.*True"),
        ({"include_background": 1}, "include_background.*1"),
        ({"empty_weight": 0.0}, "empty_weight.*0.0"),
        ({"squared_pred": "yes"}, "squared_pred.*'yes'"),
        ({"smooth_dr": 0.0}, "smooth_dr.*0.0"),
        ({"reduction": "sum"}, "reduction.*'sum'"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        L1ACELoss(**kwargs)

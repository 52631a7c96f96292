"""Focal, FLSD-53, dual focal, FCL and Brier: hand values, loop reformulations, limits, MONAI."""

import math

import numpy as np
import pytest
import torch

from .loss_zoo import random_inputs
from mcseg.losses import BrierLoss, CELoss, DualFocalLoss, FCLLoss, FLSDLoss, FocalLoss


def two_class_voxels():
    # p_y at the three voxels: 3/4 (p = (1/4, 3/4), y = 1), 1/2 (y = 0), 1/10 (p = (1/10, 9/10), y = 0)
    logits = torch.tensor([[[0.0, 0.0, 0.0], [math.log(3.0), 0.0, math.log(9.0)]]], dtype=torch.float64)
    return logits, torch.tensor([[1, 0, 0]])


def three_class_voxels():
    # p = (1/2, 3/10, 1/5) at every voxel; labels 0, 1, 2
    z = torch.tensor([math.log(5.0), math.log(3.0), math.log(2.0)], dtype=torch.float64)
    return z.view(1, 3, 1).expand(1, 3, 3).contiguous(), torch.tensor([[0, 1, 2]])


def test_focal_hand_value():
    logits, target = two_class_voxels()
    expected = ((1 / 4) ** 2 * math.log(4 / 3) + (1 / 2) ** 2 * math.log(2) + (9 / 10) ** 2 * math.log(10)) / 3
    assert FocalLoss(gamma=2.0)(logits, target).item() == pytest.approx(expected, rel=1e-12)


def test_flsd_hand_value():
    logits, target = two_class_voxels()
    # p_y = 0.75 and 0.5 -> gamma 3; p_y = 0.1 < 0.2 -> gamma 5
    expected = ((1 / 4) ** 3 * math.log(4 / 3) + (1 / 2) ** 3 * math.log(2) + (9 / 10) ** 5 * math.log(10)) / 3
    assert FLSDLoss()(logits, target).item() == pytest.approx(expected, rel=1e-12)


def test_dual_focal_hand_value():
    logits, target = three_class_voxels()
    g = 2.0
    expected = (
        (1 - 0.5 + 0.3) ** g * math.log(2)  # y = 0: largest p below 1/2 is 3/10
        + (1 - 0.3 + 0.2) ** g * math.log(10 / 3)  # y = 1: largest below 3/10 is 1/5
        + (1 - 0.2 + 0.0) ** g * math.log(5)  # y = 2: none below 1/5
    ) / 3
    assert DualFocalLoss(gamma=g)(logits, target).item() == pytest.approx(expected, rel=1e-12)


def test_fcl_and_brier_hand_values():
    logits, target = two_class_voxels()
    focal = [(1 / 4) ** 2 * math.log(4 / 3), (1 / 2) ** 2 * math.log(2), (9 / 10) ** 2 * math.log(10)]
    brier = [2 * (1 / 4) ** 2, 2 * (1 / 2) ** 2, 2 * (9 / 10) ** 2]  # sum over both classes
    weight = [(1 / 4) ** 2, (1 / 2) ** 2, (9 / 10) ** 2]  # (1 - p_y)^2
    assert BrierLoss()(logits, target).item() == pytest.approx(sum(brier) / 3, rel=1e-12)
    assert FCLLoss(alpha=0.5)(logits, target).item() == pytest.approx(
        sum(f + 0.5 * b for f, b in zip(focal, brier)) / 3, rel=1e-12
    )
    assert FCLLoss(self_adaptive=True)(logits, target).item() == pytest.approx(
        sum(f + w * b for f, w, b in zip(focal, weight, brier)) / 3, rel=1e-12
    )


# ------------------------------------------------------------------ independent loop formulations
def per_voxel_rows(logits, target):
    """N x C float64 probabilities and N labels, voxel by voxel (numpy)."""
    z = logits.detach().double().movedim(1, -1).reshape(-1, logits.shape[1]).numpy()
    p = np.exp(z - z.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True), target.reshape(-1).numpy()


def loop_mean(logits, target, fn):
    p, y = per_voxel_rows(logits, target)
    return float(np.mean([fn(p[i], int(y[i])) for i in range(len(y))]))


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (2, 3, 3, 4, 5)])
def test_loop_reformulations(shape):
    logits, target = random_inputs(shape, seed=11)

    def focal(p, y, g=3.0):
        return -((1 - p[y]) ** g) * math.log(p[y])

    def flsd(p, y):  # the FLSD-53 lookup of Mukhoti et al.: 5 below 0.2, 3 below 0.5, gamma = 3 above
        g = 5.0 if p[y] < 0.2 else 3.0
        return focal(p, y, g)

    def dual(p, y, g=5.0):
        below = [q for q in p if q < p[y]]
        return -((1 - p[y] + (max(below) if below else 0.0)) ** g) * math.log(p[y])

    def brier(p, y):
        return sum((p[k] - (k == y)) ** 2 for k in range(len(p)))

    def fcl(p, y):
        return focal(p, y, 2.0) + brier(p, y)

    def fcl_adaptive(p, y):
        return focal(p, y, 2.0) + (1 - p[y]) ** 2 * brier(p, y)

    cases = [
        (FocalLoss(), focal),
        (FLSDLoss(), flsd),
        (DualFocalLoss(), dual),
        (BrierLoss(), brier),
        (FCLLoss(), fcl),
        (FCLLoss(self_adaptive=True), fcl_adaptive),
    ]
    for loss, fn in cases:
        assert loss(logits, target).item() == pytest.approx(loop_mean(logits, target, fn), abs=1e-6), loss


def test_dual_focal_matches_official_style():
    # the official code: mask of probabilities strictly below p_y, top-1 of the masked probabilities
    logits, target = random_inputs((3, 5, 4, 4), seed=12, dtype=torch.float64)
    z = logits.movedim(1, -1).reshape(-1, 5)
    t = target.reshape(-1, 1)
    logp = torch.log_softmax(z, 1)
    probs = logp.exp()
    logp_k = logp.gather(1, t).view(-1)
    p_k = logp_k.exp()
    mask = torch.lt(probs, p_k.reshape(-1, 1)) * 1
    p_j = torch.topk(mask * probs, 1)[0].squeeze()
    ref = (-1 * (1 - p_k + p_j) ** 5.0 * logp_k).mean()
    assert DualFocalLoss()(logits, target).item() == pytest.approx(ref.item(), abs=1e-12)


# ------------------------------------------------------------------ limits and MONAI
def test_limits():
    logits, target = random_inputs((2, 4, 6, 5), seed=13)
    ce = CELoss()(logits, target)
    assert torch.allclose(FocalLoss(gamma=0.0)(logits, target), ce, rtol=1e-6)
    assert torch.allclose(DualFocalLoss(gamma=0.0)(logits, target), ce, rtol=1e-6)
    assert torch.allclose(FLSDLoss(gamma_low=0.0, gamma_high=0.0)(logits, target), ce, rtol=1e-6)
    assert torch.allclose(FLSDLoss(gamma_low=2.0, gamma_high=2.0)(logits, target), FocalLoss(2.0)(logits, target))
    for adaptive in (False, True):
        fcl = FCLLoss(gamma=2.5, alpha=0.0, self_adaptive=adaptive)
        assert torch.allclose(fcl(logits, target), FocalLoss(gamma=2.5)(logits, target), rtol=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 2.0, 3.0])
def test_focal_matches_monai_softmax_focal(gamma):
    from monai.losses import FocalLoss as MonaiFocal

    logits, target = random_inputs((2, 4, 5, 5), seed=14, dtype=torch.float64)
    ref = MonaiFocal(gamma=gamma, use_softmax=True, to_onehot_y=True)(logits, target.unsqueeze(1))
    # MONAI's mean runs over B x C x spatial elements: ours (mean over voxels) is C times larger
    assert FocalLoss(gamma=gamma)(logits, target).item() == pytest.approx(4 * ref.item(), rel=1e-6)  # MONAI: float32


def test_focal_fractional_gamma_finite_gradient_at_certainty():
    logits = torch.tensor([[[0.0], [200.0]]], requires_grad=True)  # p_y == 1 exactly in float32
    FocalLoss(gamma=0.5)(logits, torch.tensor([[1]])).backward()
    assert torch.isfinite(logits.grad).all()


def test_self_adaptive_weight_is_detached():
    logits, target = random_inputs((2, 3, 4, 4), seed=15, dtype=torch.float64)
    logits.requires_grad_(True)
    FCLLoss(alpha=0.7, self_adaptive=True)(logits, target).backward()
    # the same objective with the weight computed once, as a constant
    z = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(z, 1)
    logp_y = logp.gather(1, target.unsqueeze(1)).squeeze(1)
    weight = (1 - logp_y.exp()).detach() ** 2
    onehot = torch.nn.functional.one_hot(target, 3).movedim(-1, 1).double()
    brier = ((logp.exp() - onehot) ** 2).sum(1)
    objective = (-((1 - logp_y.exp()) ** 2) * logp_y + 0.7 * weight * brier).mean()
    objective.backward()
    assert torch.allclose(logits.grad, z.grad, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda x: (
            -((1 - torch.log_softmax(x, 1).gather(1, target.unsqueeze(1)).squeeze(1).exp()) ** 2)
            * torch.log_softmax(x, 1).gather(1, target.unsqueeze(1)).squeeze(1)
            + 0.7 * weight * ((torch.softmax(x, 1) - onehot) ** 2).sum(1)
        ).mean(),
        (z.detach().clone().requires_grad_(True),),
    )


@pytest.mark.parametrize(
    "cls, kwargs, name",
    [
        (FocalLoss, {"gamma": -1.0}, "gamma"),
        (FocalLoss, {"gamma": float("nan")}, "gamma"),
        (FLSDLoss, {"gamma_low": -1}, "gamma_low"),
        (FLSDLoss, {"gamma_high": "3"}, "gamma_high"),
        (FLSDLoss, {"threshold": 0.0}, "threshold"),
        (FLSDLoss, {"threshold": 1.5}, "threshold"),
        (DualFocalLoss, {"gamma": -0.5}, "gamma"),
        (FCLLoss, {"alpha": -1.0}, "alpha"),
        (FCLLoss, {"gamma": float("inf")}, "gamma"),
        (FCLLoss, {"self_adaptive": 1}, "self_adaptive"),
        (BrierLoss, {"reduction": "max"}, "reduction"),
    ],
)
def test_invalid_arguments(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(**kwargs)

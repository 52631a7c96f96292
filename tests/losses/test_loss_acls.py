"""ACLS: hand values (ties included), the authors' row-wise code re-derived (value and gradient), a voxel
loop, limits, arguments."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from .loss_zoo import random_inputs
from mcseg.losses import ACLSLoss, CELoss


def two_voxels():
    # voxel 1: z = (2, 0, -13), y = 0; voxel 2: z = (0, 12, 1), y = 2  (1 x 3 x 2)
    logits = torch.tensor([[[2.0, 0.0], [0.0, 12.0], [-13.0, 1.0]]], dtype=torch.float64)
    return logits, torch.tensor([[0, 2]])


def test_hand_value():
    logits, target = two_voxels()
    ce = (math.log(1 + math.exp(-2) + math.exp(-15)) + math.log(1 + math.exp(12) + math.e) - 1) / 2
    # m = 10. voxel 1: z* = 2 -> ReLU(2 - 10) = 0; negatives d = 2, 15 -> ReLU(d - 10)^2 = 0, 25
    # voxel 2: z* = 12 -> ReLU(2)^2 = 4 (the ARG-MAX class 1, not the label 2); d = 12, 11 -> 4, 1
    reg = 1.0 * (0 + 4) / 2 + 0.1 * (25 + 5) / (2 * 2)
    assert ACLSLoss()(logits, target).item() == pytest.approx(ce + 0.1 * reg, rel=1e-12)
    reg2 = 0.5 * 4 / 2 + 0.2 * 30 / 4
    assert ACLSLoss(alpha=1.0, lambda_pos=0.5, lambda_neg=0.2)(logits, target).item() == pytest.approx(
        ce + reg2, rel=1e-12)


def test_ties_give_several_positives_and_the_gradient_goes_to_the_first():
    logits = torch.tensor([[[3.0], [3.0], [0.0]]], dtype=torch.float64, requires_grad=True)  # 1 x 3 x 1
    target = torch.tensor([[2]])
    loss = ACLSLoss(margin=1.0, alpha=1.0)
    reg = 1.0 * 2 * (3 - 1) ** 2 + 0.1 * (3 - 0 - 1) ** 2 / 2  # two positives; one negative, / (K - 1)
    ce = CELoss()(logits.detach(), target).item()
    value = loss(logits, target)
    assert value.item() == pytest.approx(ce + reg, rel=1e-12)
    (value - CELoss()(logits, target)).backward()
    # d/dz*: 2 positives x 2 (z* - m) = 8, routed to the first maximum as max(dim=1); the negative's
    # detached max gives nothing; d/dz_2 of 0.1 / 2 * (z* - z_2 - 1)^2 = -0.1 * 2
    assert logits.grad.view(-1).tolist() == pytest.approx([8.0, 0.0, -0.2], rel=1e-12)


def authors_acls(logits, target, margin=10.0, alpha=0.1, pos_lambda=1.0, neg_lambda=0.1):
    """The authors' forward: flatten to (B S) x C rows, CE + alpha (pos_lambda sum(pos) / N + neg_lambda sum(neg) / (N (C - 1)))."""
    z = logits.view(logits.size(0), logits.size(1), -1).transpose(1, 2).reshape(-1, logits.size(1))
    y = target.reshape(-1)
    top = z.max(dim=1)[0].unsqueeze(1).repeat(1, z.shape[1])
    indicator = (top.clone().detach() == z.clone().detach()).double()
    n, c = z.shape
    pos = indicator * F.relu(top - margin) ** 2
    neg = (1.0 - indicator) * F.relu(top.clone().detach() - z - margin) ** 2
    return F.cross_entropy(z, y) + alpha * (pos_lambda * pos.sum() / n + neg_lambda * neg.sum() / (n * (c - 1)))


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (2, 3, 3, 4, 5)], ids=["2d", "3d"])
@pytest.mark.parametrize("margin", [10.0, 2.0])
def test_equals_the_authors_code_value_and_gradient(shape, margin):
    logits, target = random_inputs(shape, seed=41, dtype=torch.float64, scale=6.0)
    logits.view(-1)[:3] = logits.view(-1)[3]  # a few ties
    ours_z, theirs_z = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ours, theirs = ACLSLoss(margin=margin)(ours_z, target), authors_acls(theirs_z, target, margin)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_z.grad, theirs_z.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (2, 3, 3, 4, 5)], ids=["2d", "3d"])
def test_voxel_loop_reformulation(shape):
    logits, target = random_inputs(shape, seed=42, scale=6.0)
    z = logits.double().movedim(1, -1).reshape(-1, shape[1]).numpy()
    y = target.reshape(-1).numpy()
    m, total = 3.0, 0.0
    for i in range(len(y)):
        top = z[i].max()
        ce = -(z[i][y[i]] - top - math.log(np.exp(z[i] - top).sum()))
        pos = sum(max(top - m, 0.0) ** 2 for k in range(shape[1]) if z[i][k] == top)
        neg = sum(max(top - z[i][k] - m, 0.0) ** 2 for k in range(shape[1]) if z[i][k] != top)
        total += ce + 0.1 * (pos + 0.1 * neg / (shape[1] - 1))
    assert ACLSLoss(margin=m)(logits, target).item() == pytest.approx(total / len(y), rel=1e-6)


def test_limits_and_sum():
    logits, target = random_inputs((2, 4, 6, 5), seed=43)
    ce = CELoss()(logits, target)
    assert torch.allclose(ACLSLoss(alpha=0.0)(logits, target), ce, rtol=1e-6)
    assert torch.allclose(ACLSLoss(lambda_pos=0.0, lambda_neg=0.0)(logits, target), ce, rtol=1e-6)
    # margin above every logit distance and every max logit: no regulariser
    assert torch.allclose(ACLSLoss(margin=1e4)(logits, target), ce, rtol=1e-6)
    total = ACLSLoss(margin=1.0, reduction="sum")(logits, target)
    assert total.item() == pytest.approx(ACLSLoss(margin=1.0)(logits, target).item() * 60, rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"margin": -1.0}, "margin.*-1.0"),
        ({"alpha": -0.1}, "alpha.*-0.1"),
        ({"lambda_pos": "1"}, "lambda_pos.*'1'"),
        ({"lambda_neg": math.nan}, "lambda_neg.*nan"),
        ({"reduction": "none"}, "reduction.*'none'"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ACLSLoss(**kwargs)

"""MDCA and DCA: hand values, the authors' classification code re-derived on flattened voxels, a voxel loop,
the batch-level (not per-image) pooling, gradients, arguments."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from .loss_zoo import random_inputs
from mcseg.losses import CELoss, DCALoss, FocalLoss, MDCALoss


def two_class_voxels():
    # p = (1/4, 3/4) y = 1; (1/2, 1/2) y = 0; (1/10, 9/10) y = 0
    logits = torch.tensor([[[0.0, 0.0, 0.0], [math.log(3.0), 0.0, math.log(9.0)]]], dtype=torch.float64)
    return logits, torch.tensor([[1, 0, 0]])


CE = (math.log(4 / 3) + math.log(2) + math.log(10)) / 3
# class 0: mean p = (1/4 + 1/2 + 1/10)/3, frequency 2/3; class 1: mean p = 2.15/3, frequency 1/3: both gaps 1.15/3
MDCA = 1.15 / 3


@pytest.mark.parametrize(
    "kwargs, data",
    [
        ({}, CE),
        ({"classification": "focal", "gamma": 1.0},
         (1 / 4 * math.log(4 / 3) + 1 / 2 * math.log(2) + 9 / 10 * math.log(10)) / 3),
        # LS: 0.9 on the label, alpha / (K - 1) = 0.1 on the other class
        ({"classification": "ls", "alpha": 0.1},
         (0.9 * math.log(4 / 3) + 0.1 * math.log(4) + math.log(2) + 0.9 * math.log(10) + 0.1 * math.log(10 / 9)) / 3),
    ],
)
def test_mdca_hand_values(kwargs, data):
    logits, target = two_class_voxels()
    for beta in (1.0, 2.5):
        assert MDCALoss(beta=beta, **kwargs)(logits, target).item() == pytest.approx(data + beta * MDCA, rel=1e-12)


def test_dca_hand_value_and_tie_rule():
    logits, target = two_class_voxels()
    # confidences 3/4, 1/2, 9/10; predictions 1, 0 (a tie: the first maximum), 1 -> correct 1, 1, 0
    gap = abs((0.75 + 0.5 + 0.9) / 3 - 2 / 3)
    assert DCALoss()(logits, target).item() == pytest.approx(CE + 10 * gap, rel=1e-12)
    assert DCALoss(beta=1.0)(logits, target).item() == pytest.approx(CE + gap, rel=1e-12)


# ------------------------------------------------------------------ the authors' code, re-derived
def rows(logits, target):
    """All voxels of the batch as classification rows (N x C, N), as the authors' code sees a batch."""
    return logits.movedim(1, -1).reshape(-1, logits.shape[1]), target.reshape(-1)


def authors_mdca(logits, target, classification="ce", gamma=1.0, alpha=0.1, beta=1.0):
    z, y = rows(logits, target)
    if classification == "ce":
        data = F.cross_entropy(z, y)
    elif classification == "focal":
        logpt = F.log_softmax(z, 1).gather(1, y[:, None]).view(-1)
        data = (-((1 - logpt.exp()) ** gamma) * logpt).mean()
    else:
        logp = F.log_softmax(z, 1)
        smooth = torch.full_like(logp, alpha / (z.shape[1] - 1)).scatter_(1, y[:, None], 1 - alpha)
        data = (-smooth * logp).sum(1).mean()
    p = torch.softmax(z, 1)
    penalty = sum(torch.abs(p[:, c].mean() - (y == c).double().mean()) for c in range(z.shape[1])) / z.shape[1]
    return data + beta * penalty


def authors_dca(logits, target, beta=10.0):
    z, y = rows(logits, target)
    conf, pred = torch.softmax(z, 1).max(1)
    return F.cross_entropy(z, y) + beta * torch.abs(conf.mean() - pred.eq(y).double().sum() / len(y))


SHAPES = [(2, 4, 5, 6), (2, 3, 3, 4, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d"])
@pytest.mark.parametrize("classification", ["ce", "focal", "ls"])
def test_mdca_equals_the_authors_code_on_the_batch_voxels(shape, classification):
    logits, target = random_inputs(shape, seed=31, dtype=torch.float64)
    ours_z, theirs_z = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ours = MDCALoss(classification=classification)(ours_z, target)
    theirs = authors_mdca(theirs_z, target, classification)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_z.grad, theirs_z.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d"])
def test_dca_equals_the_official_code_on_the_batch_voxels(shape):
    logits, target = random_inputs(shape, seed=32, dtype=torch.float64)
    ours_z, theirs_z = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ours, theirs = DCALoss()(ours_z, target), authors_dca(theirs_z, target)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_z.grad, theirs_z.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d"])
def test_voxel_loop_reformulation(shape):
    """numpy, voxel by voxel: per-class running sums for MDCA, running confidence / correct counts for DCA."""
    logits, target = random_inputs(shape, seed=33)
    z = logits.double().movedim(1, -1).reshape(-1, shape[1]).numpy()
    y = target.reshape(-1).numpy()
    n, k = z.shape
    ce = conf = correct = 0.0
    p_sum, count = np.zeros(k), np.zeros(k)
    for i in range(n):
        p = np.exp(z[i] - z[i].max())
        p /= p.sum()
        ce -= math.log(p[y[i]])
        conf += p.max()
        correct += float(int(np.argmax(p)) == y[i])
        p_sum += p
        count[y[i]] += 1
    mdca = float(np.mean(np.abs(p_sum / n - count / n)))
    assert MDCALoss(beta=3.0)(logits, target).item() == pytest.approx(ce / n + 3.0 * mdca, abs=1e-6)
    assert DCALoss()(logits, target).item() == pytest.approx(ce / n + 10.0 * abs(conf - correct) / n, abs=1e-6)


def test_penalties_pool_the_batch_not_the_images():
    """Two images whose calibration gaps cancel: the batch-level penalty is 0, a per-image one is not."""
    # image 0: every voxel p = (.8, .2), label 1; image 1: p = (.2, .8), label 0 ... gaps +.8/-.8 per class
    z = torch.tensor([math.log(4.0), 0.0], dtype=torch.float64)
    logits = torch.stack([z.view(2, 1, 1).expand(2, 2, 2), z.flip(0).view(2, 1, 1).expand(2, 2, 2)])
    target = torch.stack([torch.ones(2, 2, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long)])
    ce = CELoss()(logits, target).item()
    assert MDCALoss()(logits, target).item() == pytest.approx(ce, rel=1e-12)  # mean p = frequency = 1/2
    per_image = MDCALoss()(logits[:1], target[:1]).item() - CELoss()(logits[:1], target[:1]).item()
    assert per_image == pytest.approx(0.8, rel=1e-12)
    # DCA: confidence .8 everywhere, accuracy 0: the gap .8 does not cancel
    assert DCALoss(beta=1.0)(logits, target).item() == pytest.approx(ce + 0.8, rel=1e-12)


def test_limits():
    logits, target = random_inputs((2, 4, 6, 5), seed=34)
    ce = CELoss()(logits, target)
    assert torch.allclose(MDCALoss(beta=0.0)(logits, target), ce, rtol=1e-6)
    assert torch.allclose(DCALoss(beta=0.0)(logits, target), ce, rtol=1e-6)
    assert torch.allclose(MDCALoss(beta=0.0, classification="focal", gamma=2.0)(logits, target),
                          FocalLoss(gamma=2.0)(logits, target), rtol=1e-6)
    assert torch.allclose(MDCALoss(beta=0.0, classification="ls", alpha=0.0)(logits, target), ce, rtol=1e-6)


def test_dca_gradient_flows_through_the_confidence_only():
    logits, target = two_class_voxels()
    logits.requires_grad_(True)
    (DCALoss()(logits, target) - CELoss()(logits, target)).backward()
    # d/dz of 10 * (mean conf - acc) (conf > acc here): 10/3 * d max_k p_k / dz per voxel
    p = torch.softmax(logits.detach(), 1)
    top = p.argmax(1)
    conf = p.max(1).values
    expected = torch.zeros_like(p)
    for v in range(3):
        for k in range(2):
            expected[0, k, v] = 10 / 3 * conf[0, v] * (float(k == top[0, v]) - p[0, k, v])
    torch.testing.assert_close(logits.grad, expected)


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (MDCALoss, {"beta": -1.0}, "beta.*-1.0"),
        (MDCALoss, {"classification": "nll"}, "classification.*'nll'"),
        (MDCALoss, {"gamma": -0.5}, "gamma.*-0.5"),
        (MDCALoss, {"alpha": 1.5}, "alpha.*1.5"),
        (MDCALoss, {"reduction": "sum"}, "reduction.*'sum'"),
        (DCALoss, {"beta": math.inf}, "beta.*inf"),
        (DCALoss, {"beta": "10"}, "beta.*'10'"),
        (DCALoss, {"reduction": "sum"}, "reduction.*'sum'"),
    ],
)
def test_bad_arguments_are_named(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)

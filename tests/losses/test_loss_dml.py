"""Dice semimetric loss: values by hand, a loop re-derivation of the authors' Tversky form and of their
boundary label smoothing, equality with soft Dice on hard labels, properness with soft labels, arguments."""

import itertools
import math

import pytest
import torch

from .loss_zoo import random_inputs
from mcseg.losses import DiceSemimetricLoss, SoftDice
from mcseg.losses.dice import boundary_voxels, dice_semimetric

IGNORE = 255


def binary_logits(p_class0):
    p = torch.tensor(p_class0, dtype=torch.float64)
    return torch.stack([p.log(), (1 - p).log()]).unsqueeze(0)


# ------------------------------------------------------------------ by hand
def test_values_by_hand():
    logits = binary_logits([0.8, 0.3])  # p = (0.8, 0.3) for class 0, (0.2, 0.7) for class 1
    target = torch.tensor([[0, 1]])
    # class 0: ||p - q|| = 0.2 + 0.3, |p| = 1.1, |q| = 1; class 1: 0.2 + 0.3, 0.9, 1; smooth 1
    dml = (0.5 / (2.1 + 2) + 0.5 / (1.9 + 2)) / 2
    assert DiceSemimetricLoss()(logits, target).item() == pytest.approx(dml, rel=1e-12)
    # the authors' preset: 0.25 CE + 0.75 DML
    ce = -(math.log(0.8) + math.log(0.7)) / 2
    preset = DiceSemimetricLoss(lambda_ce=0.25, lambda_dml=0.75)
    assert preset(logits, target).item() == pytest.approx(0.25 * ce + 0.75 * dml, rel=1e-12)
    # "present": class 1 is absent from the batch, so only class 0 counts: 0.9 / (1.1 + 2 + 2)
    absent = torch.tensor([[0, 0]])
    assert DiceSemimetricLoss()(logits, absent).item() == pytest.approx(0.9 / 5.1, rel=1e-12)
    # "all": class 1 too, with q = 0: (0.2 + 0.7) / (0.9 + 0 + 2)
    every = DiceSemimetricLoss(active_classes="all")(logits, absent).item()
    assert every == pytest.approx((0.9 / 5.1 + 0.9 / 2.9) / 2, rel=1e-12)
    # smooth 0
    assert DiceSemimetricLoss(smooth=0.0)(logits, target).item() == pytest.approx((0.5 / 2.1 + 0.5 / 1.9) / 2)


def test_batch_pooled_not_per_image():
    logits = torch.cat([binary_logits([0.8, 0.3]), binary_logits([0.6, 0.1])])
    target = torch.tensor([[0, 1], [1, 1]])
    # class 0 over the 4 voxels: p = 0.8, 0.3, 0.6, 0.1 and q = 1, 0, 0, 0
    d0 = (0.2 + 0.3 + 0.6 + 0.1) / (1.8 + 1 + 2)
    # class 1: p = 0.2, 0.7, 0.4, 0.9 and q = 0, 1, 1, 1
    d1 = (0.2 + 0.3 + 0.6 + 0.1) / (2.2 + 3 + 2)
    assert DiceSemimetricLoss()(logits, target).item() == pytest.approx((d0 + d1) / 2, rel=1e-12)


def test_boundary_by_hand():
    # 4 x 4: left half 0, right half 1; k = 3 -> columns 1 and 2 are boundary; the border is no boundary
    target = torch.tensor([[0, 0, 1, 1]] * 4).unsqueeze(0)
    expected = torch.tensor([[False, True, True, False]] * 4).unsqueeze(0)
    assert torch.equal(boundary_voxels(target, 2, 3), expected)
    # an ignored voxel at (0, 0): the voxels in its 3 x 3 window are no boundary
    valid = torch.ones_like(target, dtype=torch.bool)
    valid[0, 0, 0] = False
    expected[0, :2, :2] = False
    assert torch.equal(boundary_voxels(target, 2, 3, valid), expected)
    # k = 5: the window reaches two voxels: every voxel of a 4-wide image with two 2-wide halves
    assert boundary_voxels(target, 2, 5).all()
    assert not boundary_voxels(target, 2, 1).any()
    # the smoothed labels: boundary (1 - eps) e_y + eps / C, interior hard
    loss = DiceSemimetricLoss(boundary_epsilon=0.5)
    q = loss.soft_labels(target, 2, None, torch.float64)
    assert q[0, :, 0, 0].tolist() == [1.0, 0.0] and q[0, :, 0, 1].tolist() == [0.75, 0.25]
    assert q[0, :, 2, 2].tolist() == [0.25, 0.75] and q[0, :, 3, 3].tolist() == [0.0, 1.0]


# ------------------------------------------------------------------ a loop re-derivation
def loop_boundary(target, k, ignored):
    """A voxel is boundary if a voxel within Chebyshev distance k // 2 (inside the image) has another
    label, and none within that distance is ignored."""
    shape = target.shape[1:]
    out = torch.zeros_like(target, dtype=torch.bool)
    r = k // 2
    for b in range(target.shape[0]):
        for idx in itertools.product(*map(range, shape)):
            if ignored[(b, *idx)]:
                continue
            other = near_ignored = False
            for off in itertools.product(range(-r, r + 1), repeat=len(shape)):
                j = tuple(i + o for i, o in zip(idx, off))
                if all(0 <= x < n for x, n in zip(j, shape)):
                    near_ignored |= bool(ignored[(b, *j)])
                    other |= not ignored[(b, *j)] and int(target[(b, *j)]) != int(target[(b, *idx)])
            out[(b, *idx)] = other and not near_ignored
    return out


def loop_dml(probs, labels, keep, smooth, active, threshold=0.01):
    """The authors' Tversky form with alpha = beta = 1/2, summed over the batch, in Python loops."""
    b, c = probs.shape[:2]
    p = probs.reshape(b, c, -1).tolist()
    q = labels.reshape(b, c, -1).tolist()
    m = keep.reshape(b, -1).tolist()
    losses = []
    for k in range(c):
        pc = qc = dc = top = 0.0
        for i in range(b):
            for v in range(len(m[i])):
                if m[i][v]:
                    pc += p[i][k][v]
                    qc += q[i][k][v]
                    dc += abs(p[i][k][v] - q[i][k][v])
                    top = max(top, q[i][k][v])
        tp = (pc + qc - dc) / 2
        fp, fn = pc - tp, qc - tp
        if active == "all" or top > threshold:
            losses.append(1 - (tp + smooth) / (tp + 0.5 * fp + 0.5 * fn + smooth))
    return sum(losses) / len(losses) if losses else 0.0


@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (2, 3, 3, 4, 3)])
@pytest.mark.parametrize("epsilon", [0.0, 0.5])
def test_matches_a_loop_re_derivation(shape, epsilon):
    logits, target = random_inputs(shape, seed=4, dtype=torch.float64, scale=2.0)
    target = target.clone()
    target.view(-1)[[3, 17]] = IGNORE
    ignored = target == IGNORE
    loss = DiceSemimetricLoss(lambda_ce=0.25, lambda_dml=0.75, boundary_epsilon=epsilon, ignore_index=IGNORE)
    probs = torch.softmax(logits, 1)
    c = shape[1]
    safe = torch.where(ignored, 0, target)
    labels = torch.nn.functional.one_hot(safe, c).movedim(-1, 1).double()
    if epsilon:
        boundary = loop_boundary(safe, 3, ignored)
        assert boundary.any() and (~boundary & ~ignored).any()
        labels = torch.where(boundary.unsqueeze(1), (1 - epsilon) * labels + epsilon / c, labels)
    dml = loop_dml(probs, labels, ~ignored, 1.0, "all" if epsilon else "present")
    kl = [
        sum(q * math.log(q) for q in labels[(b, slice(None), *idx)].tolist() if q > 0)
        - sum(q * math.log(p) for q, p in zip(labels[(b, slice(None), *idx)].tolist(), probs[(b, slice(None), *idx)].tolist()))
        for b in range(shape[0])
        for idx in itertools.product(*map(range, shape[2:]))
        if not ignored[(b, *idx)]
    ]
    expected = 0.75 * dml + 0.25 * sum(kl) / len(kl)
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-12)
    # float32 with finite gradients
    z = logits.float().requires_grad_(True)
    value = loss(z, target)
    value.backward()
    assert value.item() == pytest.approx(expected, rel=1e-5)
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


# ------------------------------------------------------------------ properties
@pytest.mark.parametrize("shape", [(2, 3, 6, 5), (1, 4, 3, 4, 5)])
def test_hard_labels_equal_batch_soft_dice(shape):
    logits, target = random_inputs(shape, seed=8, dtype=torch.float64)
    assert all((target == k).any() for k in range(shape[1]))  # every class present
    for smooth in (1.0, 1e-3):
        dml = DiceSemimetricLoss(smooth=smooth)(logits, target)
        dice = SoftDice(batch=True, smooth_nr=2 * smooth, smooth_dr=2 * smooth)(torch.softmax(logits, 1), target, None)
        assert dml.item() == pytest.approx(dice.item(), rel=1e-12)


def test_proper_with_soft_labels():
    # boundary-smoothed labels q: the loss (DML and the KL term) is 0 at p = q and positive elsewhere
    target = torch.tensor([[0, 0, 1, 1, 2, 2]] * 5).unsqueeze(0)
    loss = DiceSemimetricLoss(lambda_ce=0.25, lambda_dml=0.75, boundary_epsilon=0.5)
    q = loss.soft_labels(target, 3, None, torch.float64)
    assert ((q > 0) & (q < 1)).any()
    logits = q.clamp(min=1e-30).log()  # finite logits whose softmax is q (to 1e-30)
    assert loss(logits, target).item() == pytest.approx(0.0, abs=1e-12)
    assert dice_semimetric(q, q, 1.0, "all").item() == 0.0
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        other = logits + 0.3 * torch.randn(q.shape, generator=g, dtype=torch.float64)
        assert loss(other, target).item() > 1e-4
        assert dice_semimetric(torch.softmax(other, 1), q, 1.0, "all").item() > 1e-4


def test_no_active_class_gives_zero():
    logits, target = random_inputs((1, 3, 4, 4))
    value = DiceSemimetricLoss(ignore_index=-1)(logits.requires_grad_(True), torch.full((1, 4, 4), -1))
    assert value.item() == 0.0
    value.backward()
    assert torch.all(logits.grad == 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lambda_dml": -1.0}, "lambda_dml.*-1.0"),
        ({"lambda_ce": "a"}, "lambda_ce.*'a'"),
        ({"smooth": -0.5}, "smooth.*-0.5"),
        ({"threshold": 1.0}, "threshold.*1.0"),
        ({"active_classes": "present_all"}, "active_classes.*present_all"),
        ({"boundary_epsilon": 1.5}, "boundary_epsilon.*1.5"),
        ({"boundary_kernel": 4}, "boundary_kernel.*4"),
        ({"boundary_kernel": 0}, "boundary_kernel.*0"),
        ({"reduction": "sum"}, "reduction.*sum"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DiceSemimetricLoss(**kwargs)

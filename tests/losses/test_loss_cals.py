"""CALS: PHR penalty by hand, multiplier and rho updates by hand and against the official update rules,
checkpoint state, ignore_index in the validation statistics."""

import math

import pytest
import torch
import torch.nn.functional as F

from .loss_zoo import random_inputs
from mcseg.losses import CALSLoss

LMIN = 1e-6


def phr(h, lam, rho):
    x = lam + rho * h
    return (max(0.0, x) ** 2 - lam**2) / (2 * rho)


def test_training_value_by_hand():
    # one voxel, z = (2, 0, -13), y = 0, m = 10: d = (0, 2, 15), h = (d - 10) / 10 = (-1, -0.8, 0.5)
    logits = torch.tensor([[[2.0], [0.0], [-13.0]]], dtype=torch.float64)
    target = torch.tensor([[0]])
    ce = math.log(1 + math.exp(-2) + math.exp(-15))
    loss = CALSLoss(num_classes=3)
    expected = ce + (phr(-1, LMIN, 1) + phr(-0.8, LMIN, 1) + phr(0.5, LMIN, 1)) / 3
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-12)
    # other multipliers / rho (as after some epochs)
    loss.lambd.copy_(torch.tensor([0.5, 2.0, 1.0]))
    loss.rho.copy_(torch.tensor([1.0, 2.0, 4.0]))
    expected = ce + (phr(-1, 0.5, 1) + phr(-0.8, 2.0, 2) + phr(0.5, 1.0, 4)) / 3
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-12)
    # normalize=False: h = d - m = (-10, -8, 5)
    raw = CALSLoss(num_classes=3, normalize=False)
    expected = ce + (phr(-10, LMIN, 1) + phr(-8, LMIN, 1) + phr(5, LMIN, 1)) / 3
    assert raw(logits, target).item() == pytest.approx(expected, rel=1e-12)


def run_validation(loss, epoch, volumes):
    loss.on_validation_start()
    with torch.no_grad():
        for logits, target in volumes:
            loss.on_validation_batch(logits, target)
    loss.on_validation_end(epoch)


def volume(*voxels, labels=None):
    """1 x 3 x N logits from N voxels of 3 logits (labels are irrelevant to the updates)."""
    logits = torch.tensor(voxels, dtype=torch.float64).T.unsqueeze(0)
    return logits, torch.zeros(1, logits.shape[-1], dtype=torch.long) if labels is None else labels


def test_multiplier_and_rho_updates_by_hand():
    loss = CALSLoss(num_classes=3, rho_step=2)
    # epoch 0: voxels h = (-1, 1, 0.5) and (-1, -1, 2); P' = max(0, 1e-6 + h) clipped to >= 1e-6
    run_validation(loss, 0, [volume((20.0, 0.0, 5.0)), volume((0.0, 0.0, -30.0))])
    lam0 = [LMIN, (1 + LMIN + LMIN) / 2, (0.5 + LMIN + 2 + LMIN) / 2]
    assert loss.lambd.tolist() == pytest.approx(lam0, rel=1e-12)
    assert loss.rho.tolist() == [1.0, 1.0, 1.0]
    assert loss.prev_constraint.tolist() == pytest.approx([-1.0, 0.0, 1.25])
    assert bool(loss.has_prev_constraint)
    # epoch 1: one voxel with h = (0.2, -1, 1.5); (1 + 1) % 2 == 0 -> rho grows where
    # c > 0.9 * max(c_prev, 0) = (0, 0, 1.125): classes 0 and 2
    run_validation(loss, 1, [volume((0.0, 12.0, -13.0))])
    lam1 = [max(LMIN, lam0[0] + 0.2), LMIN, lam0[2] + 1.5]  # rho was still 1 during the pass
    assert loss.lambd.tolist() == pytest.approx(lam1, rel=1e-12)
    assert loss.rho.tolist() == pytest.approx([1.2, 1.0, 1.2])
    # epoch 2: no rho step; the constraint is remembered
    run_validation(loss, 2, [volume((0.0, 12.0, -13.0))])
    assert loss.rho.tolist() == pytest.approx([1.2, 1.0, 1.2])
    lam2 = [max(LMIN, lam1[0] + 1.2 * 0.2), LMIN, lam1[2] + 1.2 * 1.5]
    assert loss.lambd.tolist() == pytest.approx(lam2, rel=1e-12)
    # epoch 3: same constraints again: not below 0.9 x previous -> grow, then capped at rho_max
    for epoch in range(3, 40):
        run_validation(loss, epoch, [volume((0.0, 12.0, -13.0))])
    assert loss.rho.tolist() == pytest.approx([10.0, 1.0, 10.0])
    assert max(loss.lambd.tolist()) <= 1e6


def test_lambd_step_and_rho_disabled():
    loss = CALSLoss(num_classes=3, lambd_step=2, rho_step=0)
    run_validation(loss, 0, [volume((20.0, 0.0, 5.0))])
    assert loss.lambd.tolist() == [LMIN] * 3  # (0 + 1) % 2 != 0
    run_validation(loss, 1, [volume((20.0, 0.0, 5.0))])
    assert loss.lambd.tolist() == pytest.approx([LMIN, 1 + LMIN, 0.5 + LMIN])
    assert loss.rho.tolist() == [1.0, 1.0, 1.0] and not bool(loss.has_prev_constraint)


class OfficialAugLagrangianClass:
    """Transcription of the published AugLagrangianClass with the PHR penalty (class-wise rho)."""

    def __init__(self, num_classes, margin, rho_step, lambd_min=1e-6, lambd_max=1e6, gamma=1.2, tao=0.9):
        self.margin, self.rho_step, self.gamma, self.tao = margin, rho_step, gamma, tao
        self.lambd_min, self.lambd_max, self.rho_min, self.rho_max = lambd_min, lambd_max, 1.0, 10.0
        self.lambd = lambd_min * torch.ones(num_classes, dtype=torch.float64)
        self.rho = self.rho_min * torch.ones(num_classes, dtype=torch.float64)
        self.prev_constraints = None

    def get_constraints(self, logits):
        return (logits.amax(dim=-1, keepdim=True) - logits - self.margin) / self.margin

    @staticmethod
    def penalty(h, lambd, rho):
        x = lambd + rho * h
        sup = x >= 0
        return (
            torch.where(sup, 1 / (2 * rho) * (x**2 - lambd**2), -1 / (2 * rho) * lambd**2),
            torch.where(sup, x, torch.zeros_like(h)),
        )

    def get(self, logits):
        h = self.get_constraints(logits.movedim(1, -1))
        return self.penalty(h, self.lambd, self.rho)[0].mean()

    def reset_update_lambd(self):
        self.grad_p_sum = torch.zeros_like(self.lambd)
        self.sample_num = 0
        self.curr_constraints = torch.zeros_like(self.rho)

    def update_lambd(self, logits):
        h = self.get_constraints(logits.movedim(1, -1))
        grad_p = self.penalty(h, self.lambd, self.rho)[1].clamp(self.lambd_min, self.lambd_max)
        grad_p = grad_p.flatten(start_dim=0, end_dim=-2)
        self.grad_p_sum += grad_p.sum(dim=0)
        self.sample_num += grad_p.shape[0]
        self.curr_constraints += h.flatten(start_dim=0, end_dim=-2).sum(dim=0)

    def set_lambd(self):
        self.lambd = torch.clamp(self.grad_p_sum / self.sample_num, self.lambd_min, self.lambd_max)

    def update_rho(self, epoch):
        self.curr_constraints = self.curr_constraints / self.sample_num
        if (epoch + 1) % self.rho_step == 0 and self.prev_constraints is not None:
            self.rho = torch.where(
                self.curr_constraints > (self.prev_constraints.clamp(min=0) * self.tao), self.gamma * self.rho, self.rho
            ).clamp(self.rho_min, self.rho_max)
        self.prev_constraints = self.curr_constraints


@pytest.mark.parametrize("shape", [(1, 4, 6, 5), (1, 4, 3, 4, 3)])
def test_matches_official_over_many_epochs(shape):
    ours = CALSLoss(num_classes=4, margin=3.0, rho_step=3)
    official = OfficialAugLagrangianClass(4, 3.0, 3)
    g = torch.Generator().manual_seed(31)
    for epoch in range(25):
        scale = 1.0 + 4.0 * torch.rand((), generator=g).item()
        volumes = [random_inputs(shape, seed=100 * epoch + i, dtype=torch.float64, scale=scale) for i in range(3)]
        # the training objective under the current multipliers
        logits, target = volumes[0]
        ref = F.cross_entropy(logits, target) + official.get(logits)
        assert ours(logits, target).item() == pytest.approx(ref.item(), rel=1e-9)
        official.reset_update_lambd()
        for z, _ in volumes:
            official.update_lambd(z)
        official.set_lambd()
        official.update_rho(epoch)
        run_validation(ours, epoch, volumes)
        assert torch.allclose(ours.lambd, official.lambd, rtol=1e-9, atol=0)
        assert torch.allclose(ours.rho, official.rho, rtol=1e-12, atol=0)
    assert (ours.rho > 1).any() and (ours.lambd > 1e-3).any()  # the updates did something


def test_state_survives_checkpoint():
    loss = CALSLoss(num_classes=4, margin=2.0, rho_step=1)
    for epoch in range(4):
        run_validation(loss, epoch, [random_inputs((1, 4, 5, 5), seed=epoch, scale=4.0 + epoch)])
    state = loss.state_dict()
    assert set(state) == {"lambd", "rho", "prev_constraint", "has_prev_constraint"}
    resumed = CALSLoss(num_classes=4, margin=2.0, rho_step=1)
    resumed.load_state_dict(state)
    logits, target = random_inputs((2, 4, 5, 5), seed=9)
    assert torch.equal(resumed(logits, target), loss(logits, target))
    nxt = [random_inputs((1, 4, 5, 5), seed=50, scale=9.0)]
    run_validation(loss, 4, nxt)
    run_validation(resumed, 4, nxt)
    assert torch.equal(resumed.lambd, loss.lambd) and torch.equal(resumed.rho, loss.rho)


def test_ignored_voxels_left_out_of_the_statistics():
    logits, target = random_inputs((1, 3, 6, 6), seed=33, dtype=torch.float64, scale=8.0)
    target[0, :2] = 255
    keep = target != 255
    a = CALSLoss(num_classes=3, margin=2.0, ignore_index=255, rho_step=1)
    b = CALSLoss(num_classes=3, margin=2.0, rho_step=1)
    run_validation(a, 0, [(logits, target)])
    run_validation(b, 0, [(logits.movedim(1, -1)[keep].T.unsqueeze(0), target[keep].unsqueeze(0))])
    assert torch.allclose(a.lambd, b.lambd) and torch.allclose(a.prev_constraint, b.prev_constraint)


def test_checks_and_warnings():
    loss = CALSLoss(num_classes=3)
    logits, target = random_inputs((1, 4, 3, 3))
    with pytest.raises(ValueError, match="num_classes=3"):
        loss(logits, target)
    with pytest.raises(ValueError, match="num_classes=3"):
        loss.on_validation_batch(logits, target)
    loss.on_validation_start()
    with pytest.warns(UserWarning, match="no validation voxels"):
        loss.on_validation_end(0)
    assert loss.lambd.tolist() == [LMIN] * 3


def test_validation_batch_under_autocast_is_float64_exact():
    logits, target = random_inputs((1, 3, 4, 4), seed=34, scale=6.0)
    a, b = CALSLoss(num_classes=3, margin=2.0), CALSLoss(num_classes=3, margin=2.0)
    run_validation(a, 0, [(logits, target)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        run_validation(b, 0, [(logits, target)])
    assert torch.equal(a.lambd, b.lambd)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_classes": 1}, "num_classes"),
        ({"num_classes": 3.0}, "num_classes"),
        ({"margin": 0.0}, "margin"),
        ({"lambd_min": -1.0}, "lambd_min"),
        ({"lambd_max": 1e-9}, "lambd_max"),
        ({"lambd_step": 0}, "lambd_step"),
        ({"rho_min": 0.0}, "rho_min"),
        ({"rho_max": 0.5}, "rho_max"),
        ({"rho_step": -1}, "rho_step"),
        ({"gamma": 0.9}, "gamma"),
        ({"tao": -0.1}, "tao"),
        ({"normalize": "yes"}, "normalize"),
        ({"reduction": "sum"}, "reduction"),
    ],
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CALSLoss(**{"num_classes": 3, **kwargs})

"""MbLS margin loss and margin + Dice: hand values, the official formulation, the m -> inf limit, the schedule."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from monai.losses import DiceCELoss
from omegaconf import OmegaConf

from .loss_zoo import random_inputs
from ..conftest import CONFIG_DIR
from mcseg.losses import CEDiceLoss, CELoss, MarginDiceLoss, MarginLoss


def two_voxels():
    # voxel 1: z = (2, 0, -13), y = 0; voxel 2: z = (0, 12, 1), y = 2  (1 x 3 x 2)
    logits = torch.tensor([[[2.0, 0.0], [0.0, 12.0], [-13.0, 1.0]]], dtype=torch.float64)
    return logits, torch.tensor([[0, 2]])


def test_hand_value():
    logits, target = two_voxels()
    ce1 = math.log(1 + math.exp(-2) + math.exp(-15))
    ce2 = math.log(1 + math.exp(12) + math.e) - 1
    # distances to the max logit: (0, 2, 15) and (12, 0, 11); ReLU(d - 10): (0, 0, 5) and (2, 0, 1)
    penalty = (5 / 3 + 3 / 3) / 2
    assert MarginLoss()(logits, target).item() == pytest.approx((ce1 + ce2) / 2 + 0.1 * penalty, rel=1e-12)
    # m = 1: ReLU(d - 1) = (0, 1, 14) and (11, 0, 10)
    penalty_m1 = (15 / 3 + 21 / 3) / 2
    assert MarginLoss(margin=1.0, alpha=0.5)(logits, target).item() == pytest.approx(
        (ce1 + ce2) / 2 + 0.5 * penalty_m1, rel=1e-12
    )


def margin_dice_by_hand(include_background):
    """CE + mean_k Dice_k + 0.1 * penalty on the two voxels (one sample), computed from scalars."""
    z = [[2.0, 0.0, -13.0], [0.0, 12.0, 1.0]]
    p = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in z]
    ce = (-math.log(p[0][0]) - math.log(p[1][2])) / 2
    g = [[1, 0, 0], [0, 0, 1]]  # one-hot labels of the two voxels
    s = 1e-5
    classes = range(0 if include_background else 1, 3)
    dice = 0.0
    for k in classes:
        inter = sum(p[v][k] * g[v][k] for v in range(2))
        denom = sum(p[v][k] for v in range(2)) + sum(g[v][k] for v in range(2))
        dice += 1 - (2 * inter + s) / (denom + s)
    penalty = (5 / 3 + 3 / 3) / 2  # as in test_hand_value
    return ce + dice / len(classes) + 0.1 * penalty


def test_margin_dice_hand_value():
    logits, target = two_voxels()
    # default: background excluded from the Dice term, as the authors' LogitMarginDICEL1
    assert MarginDiceLoss()(logits, target).item() == pytest.approx(margin_dice_by_hand(False), rel=1e-12)
    with_bg = MarginDiceLoss(include_background=True)(logits, target).item()
    assert with_bg == pytest.approx(margin_dice_by_hand(True), rel=1e-12)
    assert abs(margin_dice_by_hand(True) - margin_dice_by_hand(False)) > 1e-3  # the test can tell them apart


def official_margin_dice(logits, targets, margin, alpha):
    """The published LogitMarginDICEL1.forward (Bala93/MarginLoss, since 2023 with softmax): CE over all
    voxels + mean over samples and FOREGROUND classes of 1 - (2 sum p g + 1e-5) / (sum p + sum g + 1e-5),
    sums over the spatial dims of each sample, + alpha * relu(max z - z - m) averaged over voxels and classes."""
    probs = torch.softmax(logits, 1)[:, 1:]
    truth = F.one_hot(targets, logits.shape[1]).movedim(-1, 1).to(logits.dtype)[:, 1:]
    dims = tuple(range(2, logits.ndim))
    dice = (1 - (2 * (probs * truth).sum(dims) + 1e-5) / (probs.sum(dims) + truth.sum(dims) + 1e-5)).mean()
    penalty = F.relu(logits.amax(1, keepdim=True) - logits - margin).mean()
    return F.cross_entropy(logits, targets) + dice + alpha * penalty


@pytest.mark.parametrize("shape", [(2, 4, 6, 5), (2, 3, 4, 3, 5)])
def test_margin_dice_preset_is_the_authors_loss(shape):
    """configs/loss/margin_dice.yaml builds the authors' margin + Dice (background excluded from Dice)."""
    cfg = OmegaConf.load(Path(CONFIG_DIR) / "loss" / "margin_dice.yaml")
    loss = instantiate(cfg)
    assert isinstance(loss, MarginDiceLoss) and not loss.dice.include_background
    logits, target = random_inputs(shape, seed=24, dtype=torch.float64, scale=6.0)
    expected = official_margin_dice(logits, target, margin=10.0, alpha=0.1)
    assert loss(logits, target).item() == pytest.approx(expected.item(), rel=1e-10)


def official_mbls(logits, targets, margin, alpha, ignore_index):
    """The published LogitMarginL1.forward (flatten, drop ignored, CE + alpha * relu(diff - m).mean())."""
    inputs = logits.reshape(logits.size(0), logits.size(1), -1).transpose(1, 2).reshape(-1, logits.size(1))
    targets = targets.reshape(-1)
    index = torch.nonzero(targets != ignore_index).squeeze()
    inputs, targets = inputs[index, :], targets[index]
    diff = inputs.max(dim=1).values.unsqueeze(1).repeat(1, inputs.shape[1]) - inputs
    return F.cross_entropy(inputs, targets) + alpha * F.relu(diff - margin).mean()


@pytest.mark.parametrize("shape", [(2, 4, 6, 5), (2, 3, 4, 3, 5)])
@pytest.mark.parametrize("margin", [0.0, 3.0, 10.0])
def test_matches_official_formulation(shape, margin):
    logits, target = random_inputs(shape, seed=21, scale=6.0)
    target[0, 0] = 255
    ours = MarginLoss(margin=margin, alpha=0.1, ignore_index=255)(logits, target)
    ref = official_mbls(logits, target, margin, 0.1, 255)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6)


def test_infinite_margin_is_ce():
    logits, target = random_inputs((2, 4, 5, 5), seed=22, scale=20.0)
    ce = CELoss()(logits, target)
    assert torch.equal(MarginLoss(margin=float("inf"), alpha=5.0)(logits, target), ce)
    assert torch.allclose(MarginLoss(margin=1e6, alpha=5.0)(logits, target), ce)
    assert not torch.allclose(MarginLoss(margin=1.0, alpha=5.0)(logits, target), ce)


def test_margin_dice_is_ce_dice_plus_penalty():
    logits, target = random_inputs((2, 3, 6, 6), seed=23, dtype=torch.float64, scale=5.0)
    penalty = F.relu(logits.amax(1, keepdim=True) - logits - 2.0).mean()
    ref = DiceCELoss(to_onehot_y=True, softmax=True)(logits, target.unsqueeze(1)) + 0.3 * penalty
    ours = MarginDiceLoss(margin=2.0, alpha=0.3, include_background=True)(logits, target)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-10)
    ce_dice = CEDiceLoss(include_background=False, lambda_ce=0.5, lambda_dice=2.0)(logits, target)
    ours = MarginDiceLoss(margin=2.0, alpha=0.3, include_background=False, lambda_ce=0.5, lambda_dice=2.0)
    assert ours(logits, target).item() == pytest.approx((ce_dice + 0.3 * penalty).item(), abs=1e-10)
    inf = MarginDiceLoss(margin=float("inf"))(logits, target)
    assert inf.item() == pytest.approx(CEDiceLoss(include_background=False)(logits, target).item(), abs=1e-12)


# ------------------------------------------------------------------ schedule
class OfficialSchedule:
    """LogitMarginL1.schedule_alpha, called at the END of every epoch by the official trainer."""

    def __init__(self, alpha, schedule, mu, max_alpha, step_size):
        self.alpha, self.schedule, self.mu, self.max_alpha, self.step_size = alpha, schedule, mu, max_alpha, step_size

    def schedule_alpha(self, epoch):
        if self.schedule == "add":
            self.alpha = min(self.alpha + self.mu, self.max_alpha)
        elif self.schedule == "multiply":
            self.alpha = min(self.alpha * self.mu, self.max_alpha)
        elif self.schedule == "step":
            if (epoch + 1) % self.step_size == 0:
                self.alpha = min(self.alpha * self.mu, self.max_alpha)


@pytest.mark.parametrize(
    "schedule, mu, max_alpha, step_size",
    [(None, 0.0, 100.0, 100), ("add", 0.05, 0.5, 100), ("multiply", 1.5, 2.0, 100), ("step", 2.0, 100.0, 3)],
)
def test_schedule_matches_official(schedule, mu, max_alpha, step_size):
    loss = MarginLoss(margin=1.0, alpha=0.1, schedule=schedule, mu=mu, max_alpha=max_alpha, step_size=step_size)
    official = OfficialSchedule(0.1, schedule or "", mu, max_alpha, step_size)
    logits, target = random_inputs((1, 3, 4, 4), seed=24, dtype=torch.float64)
    penalty = F.relu(logits.amax(1, keepdim=True) - logits - 1.0).mean()
    ce = F.cross_entropy(logits, target)
    for epoch in range(12):
        loss.on_train_epoch_start(epoch)
        assert loss.current_alpha.item() == pytest.approx(official.alpha, rel=1e-12)
        assert loss(logits, target).item() == pytest.approx((ce + official.alpha * penalty).item(), rel=1e-12)
        official.schedule_alpha(epoch)  # end of the epoch


def test_schedule_survives_state_dict():
    loss = MarginLoss(schedule="add", mu=0.1)
    loss.on_train_epoch_start(5)
    resumed = MarginLoss(schedule="add", mu=0.1)
    resumed.load_state_dict(loss.state_dict())
    assert resumed.current_alpha.item() == pytest.approx(0.6)
    logits, target = random_inputs((1, 3, 4, 4), seed=25, scale=30.0)
    assert torch.equal(resumed(logits, target), loss(logits, target))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"margin": -1.0}, "margin"),
        ({"margin": float("nan")}, "margin"),
        ({"alpha": -0.1}, "alpha"),
        ({"schedule": "cosine"}, "schedule"),
        ({"mu": -1.0}, "mu"),
        ({"step_size": 0}, "step_size"),
        ({"step_size": 1.5}, "step_size"),
        ({"max_alpha": -1.0}, "max_alpha"),
    ],
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MarginLoss(**kwargs)
    with pytest.raises(ValueError, match=name):
        MarginDiceLoss(**kwargs)


def test_invalid_margin_dice_arguments():
    with pytest.raises(ValueError, match="lambda_dice"):
        MarginDiceLoss(lambda_dice=-1.0)
    with pytest.raises(ValueError, match="reduction"):
        MarginDiceLoss(reduction="sum")
    with pytest.raises(ValueError, match="epoch"):
        MarginLoss().on_train_epoch_start(-1)

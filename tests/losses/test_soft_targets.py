"""Soft targets (dataset.raters.target=mean): CE, label smoothing, focal, SVLS and Brier take class probabilities; one-hot
soft targets give the hard loss; CE on the rater mean is the mean of the raters' CEs; the other losses refuse
soft targets in one line naming the loss and the targets it accepts. Focal and SVLS are linear in the
target too, so on the rater mean they are the mean of the raters' losses."""
from __future__ import annotations

import math

import pytest
import torch

from mcseg.losses import BrierLoss, CELoss, FocalLoss, LabelSmoothingLoss, MarginLoss, SVLSLoss
from mcseg.losses.base import hard_label_only
from mcseg.losses import CEDiceLoss


def _case(seed: int = 0, k: int = 3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)
    raters = torch.randint(0, 3, (k, 2, 5, 4), generator=g)
    q = torch.stack([(raters == c).double().mean(0) for c in range(3)], dim=1)  # B x C x S rater mean
    return logits, raters, q


SOFT = [CELoss(), LabelSmoothingLoss(alpha=0.2), BrierLoss(), FocalLoss(gamma=2.0), SVLSLoss(sigma=1.0),
        MarginLoss(margin=0.5, alpha=0.3)]


@pytest.mark.parametrize("loss", SOFT, ids=lambda loss: type(loss).__name__)
def test_one_hot_soft_targets_give_the_hard_loss(loss):
    logits, raters, _ = _case()
    onehot = torch.nn.functional.one_hot(raters[0], 3).movedim(-1, 1).double()
    assert loss(logits, onehot).item() == pytest.approx(loss(logits, raters[0]).item(), rel=1e-12)


@pytest.mark.parametrize("loss", [CELoss(), LabelSmoothingLoss(alpha=0.2), FocalLoss(gamma=2.0), SVLSLoss(),
                                  MarginLoss(margin=0.5, alpha=0.3)],
                         ids=lambda loss: type(loss).__name__)
def test_ce_on_the_rater_mean_is_the_mean_of_the_raters_ce(loss):
    logits, raters, q = _case(1, k=4)
    assert loss(logits, q).item() == pytest.approx(torch.stack([loss(logits, r) for r in raters]).mean().item(),
                                                   rel=1e-12)


def test_brier_on_the_rater_mean_is_not_the_mean_of_the_raters_brier():
    logits, raters, q = _case(2, k=4)
    loss = BrierLoss()
    disagreement = (q * (1 - q)).sum(1).mean()
    assert loss(logits, q).item() == pytest.approx(
        torch.stack([loss(logits, r) for r in raters]).mean().item() - disagreement.item(), rel=1e-12)


def test_soft_targets_have_gradients_and_are_checked():
    logits, _, q = _case(3)
    logits.requires_grad_(True)
    CELoss()(logits, q).backward()
    assert torch.isfinite(logits.grad).all()
    with pytest.raises(ValueError, match="soft target must hold class probabilities"):
        CELoss()(logits.detach(), q * 2)


def test_margin_loss_on_soft_targets_is_soft_ce_plus_the_label_free_penalty():
    logits, _, q = _case(6, k=4)
    logits = logits * 4  # distances beyond the margin, so that the penalty is not zero
    alpha, margin = 0.3, 1.0
    distances = logits.max(1, keepdim=True).values - logits
    by_hand = (-(q * logits.log_softmax(1)).sum(1) + alpha * (distances - margin).clamp(min=0).mean(1)).mean()
    assert MarginLoss(margin=margin, alpha=alpha)(logits, q).item() == pytest.approx(by_hand.item(), rel=1e-12)
    assert (distances > margin).any()


def test_a_hard_label_loss_refuses_soft_targets_in_one_line():
    logits, _, q = _case(4)
    message = hard_label_only(CEDiceLoss)
    assert "\n" not in message and message.startswith("loss CEDiceLoss needs a hard label")
    assert "majority, staple, random or a rater's name" in message
    with pytest.raises(ValueError, match="loss CEDiceLoss needs a hard label per voxel and refuses "
                                         "dataset.raters.target=mean"):
        CEDiceLoss()(logits, q)
    from mcseg.losses import MarginDiceLoss

    with pytest.raises(ValueError, match="loss MarginDiceLoss needs a hard label"):
        MarginDiceLoss()(logits, q)


def test_dice_semimetric_and_ace_take_soft_targets():
    from mcseg.losses import DiceSemimetricLoss, L1ACELoss

    logits, raters, q = _case(5, k=4)
    onehot = torch.nn.functional.one_hot(raters[0], 3).movedim(-1, 1).double()
    dml = DiceSemimetricLoss(lambda_ce=0.25, active_classes="present")
    assert dml(logits, onehot).item() == pytest.approx(dml(logits, raters[0]).item(), rel=1e-12)
    # DML is a semimetric: 0 exactly where the prediction is the (soft) target
    positive = (q + 0.1) / (q + 0.1).sum(1, keepdim=True)
    assert DiceSemimetricLoss(smooth=0.0)(positive.log(), positive).item() == pytest.approx(0.0, abs=1e-12)
    for binning in ("hard", "soft"):
        ace = L1ACELoss(binning=binning, lambda_ce=0.5)
        assert ace(logits, onehot).item() == pytest.approx(ace(logits, raters[0]).item(), rel=1e-12)
    with_dice = L1ACELoss(lambda_dice=0.5)
    assert not with_dice.soft_targets
    with pytest.raises(ValueError, match=r"^loss L1ACELoss with lambda_dice > 0 \(its soft Dice term\) needs a hard"):
        with_dice(logits, q)


# Two classes, three voxels: p1 = .8 .3 .9 against the rater mean q1 = .5 .25 1 (p0 = 1 - p1, q0 = 1 - q1), two bins.
ACE_P1, ACE_Q1 = [0.8, 0.3, 0.9], [0.5, 0.25, 1.0]
# CE on the rater mean: -(1/3) sum_v sum_c q_c log p_c
ACE_CE = -sum(q * math.log(p) + (1 - q) * math.log(1 - p) for p, q in zip(ACE_P1, ACE_Q1)) / 3


@pytest.mark.parametrize("binning,ace", [
    # hard bins (0, .5], (.5, 1]: class 1: bin 0 {.3}: |.3 - .25|; bin 1 {.8, .9}: |.85 - .75|; mean .075;
    # class 0 (p0 = .2 .7 .1, q0 = .5 .75 0): bin 0 {.2, .1}: |.15 - .25|; bin 1 {.7}: |.7 - .75|; mean .075
    ("hard", 0.075),
    # soft: centres .25, .75; a voxel below the first or above the last gives its whole weight to that end bin,
    # between them (p - .25) / .5 to the upper one. Class 1: .3 puts .9 in bin 0 (alone: |.3 - .25| = .05) and .1
    # in bin 1, with .8 and .9 (weights 1, .1, 1: |(.8 + .03 + .9) - (.5 + .025 + 1)| / 2.1 = .205 / 2.1);
    # class 0 mirrors it (.7 puts .9 in bin 1, alone; .2 and .1 whole in bin 0): the same two gaps
    ("soft", (0.05 + 0.205 / 2.1) / 2),
])
def test_ml1_ace_on_the_rater_mean_by_hand(binning, ace):
    from mcseg.losses import L1ACELoss

    p1 = torch.tensor(ACE_P1, dtype=torch.float64)
    # 1 x 2 x 1 x 3 logits whose softmax is (1 - p1, p1)
    logits = torch.stack([torch.zeros(3, dtype=torch.float64), torch.log(p1 / (1 - p1))])[None, :, None]
    q1 = torch.tensor(ACE_Q1, dtype=torch.float64)
    q = torch.stack([1 - q1, q1])[None, :, None]
    loss = L1ACELoss(binning=binning, num_bins=2, lambda_ace=1.0, lambda_ce=0.0)
    assert loss(logits, q).item() == pytest.approx(ace, rel=1e-6)
    assert L1ACELoss(binning=binning, num_bins=2)(logits, q).item() == pytest.approx(0.5 * ace + 0.5 * ACE_CE,
                                                                                       rel=1e-6)


@pytest.mark.parametrize("loss, name", [("crac", "CRaCLoss"), ("sdc", "SDCLoss")])
def test_the_newest_losses_refuse_the_rater_mean_at_start_naming_the_key(loss, name):
    """Built from their configs as a run builds them (issue #49): refused before anything is loaded."""
    from mcseg.config import ConfigError
    from mcseg.training.build import check_soft_targets
    from tests.conftest import ROOT, TINY_2D, compose_config

    cfg = compose_config("train", TINY_2D + [f"loss={loss}"], ROOT / "unused")
    with pytest.raises(ConfigError, match=f"loss {name} needs a hard label per voxel and refuses "
                                          r"dataset.raters.target=mean \(the soft rater mean\); it accepts "
                                          "dataset.raters.target=majority, staple, random or a rater's name"):
        check_soft_targets(cfg.loss)

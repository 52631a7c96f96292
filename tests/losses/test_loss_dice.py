"""CE + soft Dice: hand-derived values, MONAI DiceCELoss, ignore_index."""

import math

import pytest
import torch
from monai.losses import DiceCELoss, DiceLoss

from mcseg.losses import CEDiceLoss, SoftDice

S = 1e-5


def two_voxels():
    # voxel 1: z = (0, ln 3) -> p = (1/4, 3/4), label 1; voxel 2: z = (0, 0) -> p = (1/2, 1/2), label 0
    logits = torch.tensor([[[[0.0, 0.0]], [[math.log(3.0), 0.0]]]])  # 1 x 2 x 1 x 2
    target = torch.tensor([[[1, 0]]])
    return logits, target


def test_hand_value_with_background():
    logits, target = two_voxels()
    ce = (math.log(4 / 3) + math.log(2)) / 2
    dice0 = 1 - (2 * 0.5 + S) / (0.75 + 1 + S)
    dice1 = 1 - (2 * 0.75 + S) / (1.25 + 1 + S)
    expected = ce + (dice0 + dice1) / 2
    assert CEDiceLoss()(logits, target).item() == pytest.approx(expected, rel=1e-6)


def test_hand_value_without_background_and_weights():
    logits, target = two_voxels()
    ce = (math.log(4 / 3) + math.log(2)) / 2
    dice1 = 1 - (2 * 0.75 + S) / (1.25 + 1 + S)
    loss = CEDiceLoss(lambda_ce=2.0, lambda_dice=0.5, include_background=False)
    assert loss(logits, target).item() == pytest.approx(2 * ce + 0.5 * dice1, rel=1e-6)


def test_batch_pools_sums():
    # two samples, each one voxel: per-sample Dice vs pooled Dice differ and are derived by hand
    logits = torch.tensor([[[[0.0]], [[math.log(3.0)]]], [[[0.0]], [[0.0]]]], dtype=torch.float64)  # 2 x 2 x 1 x 1
    target = torch.tensor([[[1]], [[0]]])
    dice = SoftDice(batch=True)
    probs = torch.softmax(logits, 1)
    pooled0 = 1 - (2 * 0.5 + S) / (0.75 + 1 + S)
    pooled1 = 1 - (2 * 0.75 + S) / (1.25 + 1 + S)
    assert dice(probs, target, None).item() == pytest.approx((pooled0 + pooled1) / 2, rel=1e-9)
    # per sample: sample 1 (label 1, p=(1/4,3/4)) and sample 2 (label 0, p=(1/2,1/2))
    s1 = [1 - S / (0.25 + S), 1 - (1.5 + S) / (1.75 + S)]
    s2 = [1 - (1 + S) / (1.5 + S), 1 - S / (0.5 + S)]
    per_sample = SoftDice(batch=False)(probs, target, None).item()
    assert per_sample == pytest.approx((sum(s1) + sum(s2)) / 4, rel=1e-9)


@pytest.mark.parametrize("include_background", [True, False])
@pytest.mark.parametrize("batch", [True, False])
@pytest.mark.parametrize("shape", [(2, 4, 6, 5), (2, 3, 4, 5, 3)])
def test_matches_monai(include_background, batch, shape):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    ours = CEDiceLoss(include_background=include_background, batch=batch)(logits, target)
    ref = DiceCELoss(to_onehot_y=True, softmax=True, include_background=include_background, batch=batch)(
        logits, target.unsqueeze(1)
    )
    assert ours.item() == pytest.approx(ref.item(), abs=1e-10)


def test_ignore_index_matches_monai_masked_dice():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 3, 6, 6, generator=g, dtype=torch.float64)
    target = torch.randint(0, 3, (1, 6, 6), generator=g)
    target[0, :2] = 255
    valid = target != 255
    ours = CEDiceLoss(ignore_index=255)(logits, target)
    safe = torch.where(valid, target, 0)
    # MONAI: mask the probabilities and the one-hot before Dice; CE with its ignore_index
    probs = torch.softmax(logits, 1) * valid[:, None]
    onehot = torch.nn.functional.one_hot(safe, 3).movedim(-1, 1).double() * valid[:, None]
    dice = DiceLoss()(probs, onehot)
    ce = torch.nn.functional.cross_entropy(logits, target, ignore_index=255)
    assert ours.item() == pytest.approx((ce + dice).item(), abs=1e-10)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"lambda_ce": -1.0}, "lambda_ce"),
        ({"lambda_dice": "x"}, "lambda_dice"),
        ({"include_background": 1}, "include_background"),
        ({"batch": None}, "batch"),
        ({"smooth_dr": 0.0}, "smooth_dr"),
        ({"smooth_nr": -1e-5}, "smooth_nr"),
        ({"reduction": "sum"}, "reduction"),
    ],
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CEDiceLoss(**kwargs)

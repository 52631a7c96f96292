"""CE, label smoothing and the entropy confidence penalty: hand values, torch/MONAI references, limits."""

import math

import pytest
import torch
import torch.nn.functional as F

from mcseg.losses import CELoss, ECPLoss, LabelSmoothingLoss


def three_voxels():
    # p at the three voxels: (1/4, 3/4), (1/2, 1/2), (1/5, 4/5); labels 1, 0, 0
    logits = torch.tensor([[[0.0, 0.0, 0.0], [math.log(3.0), 0.0, math.log(4.0)]]], dtype=torch.float64)
    return logits, torch.tensor([[1, 0, 0]])  # 1 x 2 x 3 (one spatial dim)


def test_ce_hand_value():
    logits, target = three_voxels()
    expected = (math.log(4 / 3) + math.log(2) + math.log(5)) / 3
    assert CELoss()(logits, target).item() == pytest.approx(expected, rel=1e-12)
    assert CELoss(reduction="sum")(logits, target).item() == pytest.approx(3 * expected, rel=1e-12)


def test_ce_ignore_index_hand_value():
    logits, target = three_voxels()
    target[0, 2] = -100
    expected = (math.log(4 / 3) + math.log(2)) / 2
    assert CELoss(ignore_index=-100)(logits, target).item() == pytest.approx(expected, rel=1e-12)


def test_ls_hand_value():
    logits, target = three_voxels()
    a = 0.1
    per = [
        (1 - a) * math.log(4 / 3) + a * (math.log(4) + math.log(4 / 3)) / 2,
        (1 - a) * math.log(2) + a * math.log(2),
        (1 - a) * math.log(5) + a * (math.log(5) + math.log(5 / 4)) / 2,
    ]
    assert LabelSmoothingLoss()(logits, target).item() == pytest.approx(sum(per) / 3, rel=1e-12)


def test_ecp_hand_value():
    logits, target = three_voxels()
    ce = (math.log(4 / 3) + math.log(2) + math.log(5)) / 3

    def ent(ps):
        return -sum(p * math.log(p) for p in ps)

    mean_ent = (ent([0.25, 0.75]) + ent([0.5, 0.5]) + ent([0.2, 0.8])) / 3
    # class_mean=True: the entropy is averaged over the K = 2 classes as well
    assert ECPLoss(alpha=0.3)(logits, target).item() == pytest.approx(ce - 0.3 * mean_ent / 2, rel=1e-12)
    assert ECPLoss(alpha=0.3, class_mean=False)(logits, target).item() == pytest.approx(
        ce - 0.3 * mean_ent, rel=1e-12
    )


@pytest.mark.parametrize("shape", [(2, 4, 5, 6), (2, 3, 4, 3, 5)])
@pytest.mark.parametrize("ignore_index", [None, 2, -100])
def test_ce_and_ls_match_torch(shape, ignore_index):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    if ignore_index == -100:
        target[0, 0] = -100
    kw = {} if ignore_index is None else {"ignore_index": ignore_index}
    ce = CELoss(ignore_index=ignore_index)(logits, target)
    assert ce.item() == pytest.approx(F.cross_entropy(logits, target, **kw).item(), abs=1e-12)
    for a in (0.0, 0.1, 0.7):
        ls = LabelSmoothingLoss(alpha=a, ignore_index=ignore_index)(logits, target)
        ref = F.cross_entropy(logits, target, label_smoothing=a, **kw)
        assert ls.item() == pytest.approx(ref.item(), abs=1e-12)


def test_ls_matches_monai_dicece_label_smoothing():
    from monai.losses import DiceCELoss

    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64)
    target = torch.randint(0, 3, (2, 5, 5), generator=g)
    ref = DiceCELoss(to_onehot_y=True, softmax=True, lambda_dice=0.0, label_smoothing=0.1)(logits, target[:, None])
    assert LabelSmoothingLoss(alpha=0.1)(logits, target).item() == pytest.approx(ref.item(), abs=1e-12)


def test_ecp_independent_formulation():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 5, 4, 6, generator=g, dtype=torch.float64) * 4
    target = torch.randint(0, 5, (2, 4, 6), generator=g)
    # MbLS-code formulation: clamped probabilities, entropy averaged over N * K
    p = torch.softmax(logits, 1).clamp(1e-10, 1.0)
    ent = (-p * p.log()).mean()
    ref = F.cross_entropy(logits, target) - 0.1 * ent
    assert ECPLoss()(logits, target).item() == pytest.approx(ref.item(), abs=1e-6)
    ref_pereyra = F.cross_entropy(logits, target) - 0.1 * (-p * p.log()).sum(1).mean()
    assert ECPLoss(class_mean=False)(logits, target).item() == pytest.approx(ref_pereyra.item(), abs=1e-6)


def test_ls_alpha_zero_equals_ce():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 3, 4, 3, 2, generator=g)
    target = torch.randint(0, 3, (2, 4, 3, 2), generator=g)
    assert torch.allclose(LabelSmoothingLoss(alpha=0.0)(logits, target), CELoss()(logits, target), atol=1e-7)


def test_ecp_alpha_zero_equals_ce():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 3, 4, 4, generator=g)
    target = torch.randint(0, 3, (2, 4, 4), generator=g)
    assert torch.allclose(ECPLoss(alpha=0.0)(logits, target), CELoss()(logits, target), atol=1e-7)


@pytest.mark.parametrize(
    "cls, kwargs, name",
    [
        (LabelSmoothingLoss, {"alpha": 1.5}, "alpha"),
        (LabelSmoothingLoss, {"alpha": -0.1}, "alpha"),
        (ECPLoss, {"alpha": -1.0}, "alpha"),
        (ECPLoss, {"class_mean": "yes"}, "class_mean"),
        (CELoss, {"ignore_index": 1.5}, "ignore_index"),
        (CELoss, {"reduction": "none"}, "reduction"),
    ],
)
def test_invalid_arguments(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(**kwargs)

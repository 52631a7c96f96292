"""Multi-label BCE and SPA: hand values, BCE limit, properness of the SPA inverse link, masks, checks."""

import math

import pytest
import torch
import torch.nn.functional as F

from mcseg.losses import SigmoidBCELoss, SPALoss


def test_bce_hand_value():
    # z = (0, ln 3), y = (1, 0): -log(1/2) and -log(1 - 3/4)
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)  # 1 x 1 x 2
    target = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    assert SigmoidBCELoss()(logits, target).item() == pytest.approx((math.log(2) + math.log(4)) / 2, rel=1e-12)
    assert SigmoidBCELoss(reduction="sum")(logits, target).item() == pytest.approx(math.log(8), rel=1e-12)


def test_spa_hand_value():
    # defaults zeta+ = 1, k+ = 1, b+ = 0, zeta- = 5, k- = 3, b- = 1
    logits = torch.tensor([[[0.0, 1.0, 0.0, 2.0]]], dtype=torch.float64)
    target = torch.tensor([[[1.0, 0.0, 0.0, 1.0]]], dtype=torch.float64)
    expected = [
        math.log(2),  # y = 1, z = 0: -log sigmoid(0)
        math.log(2) / 5,  # y = 0, z = 1: -(1/5) log sigmoid(-3 (1 - 1))
        math.log(1 + math.exp(-3)) / 5,  # y = 0, z = 0: -(1/5) log sigmoid(3)
        math.log(1 + math.exp(-2)),  # y = 1, z = 2
    ]
    assert SPALoss()(logits, target).item() == pytest.approx(sum(expected) / 4, rel=1e-12)


def random_multilabel(shape, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    return logits, (torch.rand(shape, generator=g) > 0.6).double()


@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (2, 3, 4, 3, 5)])
def test_bce_matches_torch_and_spa_with_unit_parameters_is_bce(shape):
    logits, target = random_multilabel(shape, 61)
    ref = F.binary_cross_entropy_with_logits(logits, target)
    assert SigmoidBCELoss()(logits, target).item() == pytest.approx(ref.item(), abs=1e-12)
    unit = SPALoss(zeta_pos=1, k_pos=1, b_pos=0, zeta_neg=1, k_neg=1, b_neg=0)
    assert unit(logits, target).item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(unit.probabilities(logits), torch.sigmoid(logits), atol=1e-12)
    assert torch.allclose(SigmoidBCELoss().probabilities(logits), torch.sigmoid(logits), atol=1e-15)


def test_spa_matches_elementwise_formula():
    logits, target = random_multilabel((2, 3, 4, 4), 62)
    zp, kp, bp, zn, kn, bn = 2.0, 1.5, 0.5, 4.0, 2.0, -1.0
    lp = -torch.log(torch.sigmoid(kp * (logits - bp))) / zp
    ln = -torch.log(1 - torch.sigmoid(kn * (logits - bn))) / zn
    ref = (target * lp + (1 - target) * ln).mean()
    loss = SPALoss(zeta_pos=zp, k_pos=kp, b_pos=bp, zeta_neg=zn, k_neg=kn, b_neg=bn)
    assert loss(logits, target).item() == pytest.approx(ref.item(), abs=1e-12)


def spa_minimiser(eta, loss):
    """argmin_z eta l+(z) + (1 - eta) l-(z) by bisection on the derivative (the objective is convex)."""

    def slope(z):
        z = torch.tensor([z], dtype=torch.float64, requires_grad=True)
        one, zero = torch.ones(1, 1, 1, dtype=torch.float64), torch.zeros(1, 1, 1, dtype=torch.float64)
        risk = eta * loss(z.view(1, 1, 1), one) + (1 - eta) * loss(z.view(1, 1, 1), zero)
        (grad,) = torch.autograd.grad(risk, z)
        return grad.item()

    lo, hi = -60.0, 60.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slope(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("params", [{}, {"zeta_pos": 2.0, "k_pos": 0.5, "b_pos": -1.0, "zeta_neg": 0.5, "k_neg": 4.0}])
@pytest.mark.parametrize("eta", [0.02, 0.2, 0.5, 0.8, 0.97])
def test_inverse_link_recovers_the_true_probability(params, eta):
    """Strict properness: the risk minimiser for probability eta maps back to eta."""
    loss = SPALoss(**params)
    z_star = spa_minimiser(eta, loss)
    eta_back = loss.probabilities(torch.tensor([[[z_star]]], dtype=torch.float64))
    assert eta_back.item() == pytest.approx(eta, abs=1e-6)


def test_inverse_link_formula_and_extremes():
    loss = SPALoss()
    z = torch.linspace(-8, 8, 101, dtype=torch.float64).view(1, 1, -1)
    s = torch.sigmoid
    direct = 1 / (1 + 1 * 5 * s(-1 * (z - 0)) / (3 * 1 * s(3 * (z - 1))))
    assert torch.allclose(loss.probabilities(z), direct, atol=1e-12)
    wide = torch.linspace(-1e4, 1e4, 20001).view(1, 1, -1)  # float32
    eta = loss.probabilities(wide)
    assert torch.isfinite(eta).all() and (eta >= 0).all() and (eta <= 1).all()
    assert (eta[..., 1:] >= eta[..., :-1]).all()  # monotone
    assert eta[..., 0].item() == pytest.approx(0.0, abs=1e-30) and eta[..., -1].item() == pytest.approx(1.0)


@pytest.mark.parametrize("name, cls", [("bce", SigmoidBCELoss), ("spa", SPALoss)])
def test_mask(name, cls):
    logits, target = random_multilabel((2, 3, 4, 5), 63)
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 1, 4, 5, generator=g) > 0.5  # voxel mask, broadcast over regions
    full = mask.expand(2, 3, 4, 5)
    loss = cls()
    kept_logits = logits[full].view(1, 1, -1)
    kept_target = target[full].view(1, 1, -1)
    expected = loss(kept_logits, kept_target).item()
    assert loss(logits, target, mask).item() == pytest.approx(expected, rel=1e-12)
    assert loss(logits, target, full.float()).item() == pytest.approx(expected, rel=1e-12)
    changed = logits.clone()
    changed[~full] = 1e4
    assert loss(changed, target, mask).item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="mask shape"):
        loss(logits, target, mask[:, :, :2])


@pytest.mark.parametrize("cls", [SigmoidBCELoss, SPALoss])
def test_input_checks(cls):
    logits, target = random_multilabel((2, 3, 4, 5), 64)
    loss = cls()
    with pytest.raises(ValueError, match="same shape|logits' shape"):
        loss(logits, target[:, 0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        loss(logits, target * 2)
    with pytest.raises(ValueError, match="B x R x spatial"):
        loss(logits[0, 0], target[0, 0])
    assert loss(logits, target.bool()).item() == pytest.approx(loss(logits, target).item())
    soft = target * 0.5 + 0.25
    assert torch.isfinite(loss(logits, soft))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"zeta_pos": 0.0}, "zeta_pos"),
        ({"zeta_neg": -1.0}, "zeta_neg"),
        ({"k_pos": 0.0}, "k_pos"),
        ({"k_neg": "3"}, "k_neg"),
        ({"b_pos": float("nan")}, "b_pos"),
        ({"b_neg": float("inf")}, "b_neg"),
        ({"reduction": "none"}, "reduction"),
    ],
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SPALoss(**kwargs)

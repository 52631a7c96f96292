"""NACL: hand values, MONAI's NACLLoss, the published 2D code, windows, borders, ignore_index."""

import math

import pytest
import torch
import torch.nn.functional as F
from monai.losses import NACLLoss as MonaiNACL

from .loss_zoo import random_inputs
from mcseg.losses import CELoss, NACLLoss
from mcseg.losses.neighbourhood import make_kernel


def two_voxels():
    # 1 x 2 x 1 x 2: voxel 0 z = (0.5, -1), label 1; voxel 1 z = (2, 0.25), label 0
    logits = torch.tensor([[[[0.5, 2.0]], [[-1.0, 0.25]]]], dtype=torch.float64)
    return logits, torch.tensor([[[1, 0]]])


def ce_two_voxels():
    return (math.log(math.exp(0.5) + math.exp(-1.0)) + 1.0 + math.log(math.exp(2.0) + math.exp(0.25)) - 2.0) / 2


def penalty(tau, z, square=False):
    """mean over voxels and classes of |tau - z| (tau, z: per voxel lists of 2)."""
    terms = [(t - v) ** 2 if square else abs(t - v) for tv, zv in zip(tau, z) for t, v in zip(tv, zv)]
    return sum(terms) / len(terms)


Z = [(0.5, -1.0), (2.0, 0.25)]


def test_hand_value_background_padding():
    # 3x3 window on a 1 x 2 map: 6 padded rows + 1 padded column count as class 0 (out of 9)
    # voxel 0: row = [pad 0, 1, 0] -> class 1: 1/9; voxel 1: row = [1, 0, pad 0] -> class 1: 1/9
    tau = [(8 / 9, 1 / 9), (8 / 9, 1 / 9)]
    logits, target = two_voxels()
    expected = ce_two_voxels() + 0.1 * penalty(tau, Z)
    assert NACLLoss()(logits, target).item() == pytest.approx(expected, rel=1e-12)
    expected_l2 = ce_two_voxels() + 0.3 * penalty(tau, Z, square=True)
    assert NACLLoss(alpha=0.3, distance="l2")(logits, target).item() == pytest.approx(expected_l2, rel=1e-12)


def test_hand_value_zero_and_replicate_padding():
    logits, target = two_voxels()
    # zeros: only the two real voxels count -> each class 1/9 at both voxels
    tau = [(1 / 9, 1 / 9), (1 / 9, 1 / 9)]
    assert NACLLoss(padding="zeros")(logits, target).item() == pytest.approx(
        ce_two_voxels() + 0.1 * penalty(tau, Z), rel=1e-12
    )
    # replicate: voxel 0 sees columns [1, 1, 0] (x3 rows) -> (1/3, 2/3); voxel 1 sees [1, 0, 0] -> (2/3, 1/3)
    tau = [(1 / 3, 2 / 3), (2 / 3, 1 / 3)]
    assert NACLLoss(padding="replicate")(logits, target).item() == pytest.approx(
        ce_two_voxels() + 0.1 * penalty(tau, Z), rel=1e-12
    )


def test_hand_value_with_ignored_voxel():
    # 1 x 2 x 1 x 3, labels 1, 0, ignored; replicate padding:
    # voxel 0 columns [1, 1, 0] -> (1/3, 2/3); voxel 1 columns [1, 0, ignored] -> renormalised (1/2, 1/2)
    logits = torch.tensor([[[[0.5, 2.0, 9.0]], [[-1.0, 0.25, -7.0]]]], dtype=torch.float64)
    target = torch.tensor([[[1, 0, 255]]])
    tau = [(1 / 3, 2 / 3), (1 / 2, 1 / 2)]
    loss = NACLLoss(padding="replicate", ignore_index=255)
    assert loss(logits, target).item() == pytest.approx(ce_two_voxels() + 0.1 * penalty(tau, Z), rel=1e-12)


@pytest.mark.parametrize("shape", [(2, 4, 7, 6), (2, 3, 5, 4, 6)])
@pytest.mark.parametrize("distance", ["l1", "l2"])
def test_matches_monai_mean_window(shape, distance):
    logits, target = random_inputs(shape, seed=51)
    ref = MonaiNACL(classes=shape[1], dim=len(shape) - 2, distance_type=distance, alpha=0.1)(logits, target)
    ours = NACLLoss(padding="zeros", distance=distance)(logits, target)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    ours5 = NACLLoss(padding="zeros", kernel_size=5, alpha=0.4)(logits, target)
    ref5 = MonaiNACL(classes=shape[1], dim=len(shape) - 2, kernel_size=5, alpha=0.4)(logits, target)
    assert ours5.item() == pytest.approx(ref5.item(), rel=1e-6)


def published_nacl_2d(inputs, targets, nc, ks=3, kernel_ops="mean", alpha=0.1, sigma=1.0):
    """The official 2D NACL code: unfold of the zero-padded label map (mean) or the SVLS conv (gaussian)."""
    if kernel_ops == "mean":
        mask = targets.unsqueeze(1)
        bs, _, h, w = mask.shape
        umask = torch.nn.Unfold(kernel_size=(ks, ks), padding=ks // 2)(mask.double())
        counts = [torch.sum(umask == ii, 1).double() / ks**2 for ii in range(nc)]
        rmask = torch.stack(counts, dim=1).reshape(bs, nc, h, w)
    else:
        grid = torch.stack(torch.meshgrid(torch.arange(ks), torch.arange(ks), indexing="xy"), -1).double()
        g = torch.exp(-((grid - (ks - 1) / 2) ** 2).sum(-1) / (2 * sigma**2))
        g = g / g.sum()
        neighbors_sum = (1 - g[1, 1]) + 1e-16
        g[ks // 2, ks // 2] = neighbors_sum
        kernel = g / neighbors_sum
        layer = torch.nn.Conv2d(nc, nc, ks, groups=nc, bias=False, padding=ks // 2, padding_mode="replicate")
        layer.weight.data = kernel.expand(nc, 1, ks, ks).clone()
        oh = F.one_hot(targets, nc).permute(0, 3, 1, 2).double()
        with torch.no_grad():
            rmask = layer(oh) / kernel.sum()
    loss_ce = F.cross_entropy(inputs, targets)
    return loss_ce + alpha * torch.abs(rmask - inputs).mean()


@pytest.mark.parametrize("ks", [3, 5])
def test_matches_published_2d_mean(ks):
    logits, target = random_inputs((2, 4, 8, 7), seed=52, dtype=torch.float64)
    ref = published_nacl_2d(logits, target, 4, ks)
    assert NACLLoss(kernel_size=ks)(logits, target).item() == pytest.approx(ref.item(), abs=1e-12)


def test_matches_published_2d_gaussian_option():
    logits, target = random_inputs((2, 4, 8, 7), seed=53, dtype=torch.float64)
    ref = published_nacl_2d(logits, target, 4, 3, kernel_ops="gaussian", sigma=1.0)
    ours = NACLLoss(kernel="svls", padding="replicate")(logits, target)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-12)


def test_gaussian_window():
    k = make_kernel("gaussian", 3, 1.0, 2)
    e, c = math.exp(-0.5), math.exp(-1.0)
    assert k[1, 1].item() == pytest.approx(1 / (1 + 4 * e + 4 * c), rel=1e-12)
    assert k[0, 1].item() == pytest.approx(e / (1 + 4 * e + 4 * c), rel=1e-12)
    assert k[0, 0].item() == pytest.approx(c / (1 + 4 * e + 4 * c), rel=1e-12)
    # sigma -> 0: a delta, so tau is the one-hot label and (l1) the penalty is mean |e_y - z|
    logits, target = random_inputs((2, 3, 5, 5), seed=54, dtype=torch.float64)
    onehot = F.one_hot(target, 3).movedim(-1, 1).double()
    expected = F.cross_entropy(logits, target) + 0.1 * (onehot - logits).abs().mean()
    assert NACLLoss(kernel="gaussian", sigma=1e-6)(logits, target).item() == pytest.approx(expected.item(), abs=1e-12)


def test_alpha_zero_is_ce():
    logits, target = random_inputs((2, 3, 4, 5, 3), seed=55)
    assert torch.allclose(NACLLoss(alpha=0.0)(logits, target), CELoss()(logits, target), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"alpha": -1.0}, "alpha"),
        ({"kernel": "box"}, "kernel"),
        ({"kernel_size": 2}, "kernel_size"),
        ({"kernel": "svls", "kernel_size": 1}, "kernel_size"),
        ({"sigma": 0.0}, "sigma"),
        ({"padding": "reflect"}, "padding"),
        ({"distance": "cosine"}, "distance"),
    ],
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NACLLoss(**kwargs)

"""SVLS: the published kernel table, the published code, a loop formulation, hand values, limits, ignore_index."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from .loss_zoo import random_inputs
from mcseg.losses import CELoss, SVLSLoss
from mcseg.losses.neighbourhood import make_kernel


def test_published_kernel_table():
    k2 = make_kernel("svls", 3, 1.0, 2)
    assert k2[1, 1].item() == pytest.approx(0.5, abs=1e-15)
    assert k2[0, 1].item() == pytest.approx(0.0778, abs=5e-5)
    assert k2[0, 0].item() == pytest.approx(0.0472, abs=5e-5)
    k3 = make_kernel("svls", 3, 1.0, 3)
    assert k3[1, 1, 1].item() == pytest.approx(0.5, abs=1e-15)
    assert k3[0, 1, 1].item() == pytest.approx(0.0308, abs=5e-5)
    assert k3[0, 0, 1].item() == pytest.approx(0.0187, abs=5e-5)
    assert k3[0, 0, 0].item() == pytest.approx(0.0113, abs=5e-5)
    # exactly: neighbours share 1/2 by exp(-r^2 / 2)
    edge, corner = math.exp(-0.5), math.exp(-1.0)
    assert k2[0, 1].item() == pytest.approx(edge / (2 * (4 * edge + 4 * corner)), rel=1e-12)


@pytest.mark.parametrize("size", [3, 5, 7])
@pytest.mark.parametrize("sigma", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("dims", [2, 3])
def test_kernel_centre_half_and_sum_one(size, sigma, dims):
    k = make_kernel("svls", size, sigma, dims)
    assert k.shape == (size,) * dims
    assert k.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert k[(size // 2,) * dims].item() == pytest.approx(0.5, abs=1e-12)
    assert torch.equal(k, k.flip(0)) and torch.equal(k, k.transpose(0, 1))


@pytest.mark.parametrize("dims", [2, 3])
def test_kernel_limits_in_sigma(dims):
    for sigma in (1e-3, 1e-30):  # -> centre 1/2 and 1/(4d) on each of the 2d face neighbours
        k = make_kernel("svls", 3, sigma, dims)
        faces = torch.zeros_like(k)
        for axis in range(dims):
            for side in (0, 2):
                idx = [1] * dims
                idx[axis] = side
                faces[tuple(idx)] = 1.0 / (4 * dims)
        faces[(1,) * dims] = 0.5
        assert torch.allclose(k, faces, atol=1e-12, rtol=0)
    k = make_kernel("svls", 3, 1e8, dims)  # -> the neighbours share 1/2 equally
    expected = torch.full_like(k, 0.5 / (3**dims - 1))
    expected[(1,) * dims] = 0.5
    assert torch.allclose(k, expected, atol=1e-12)


# ------------------------------------------------------------------ the published code
def published_svls(logits, labels, sigma=1.0):
    """CELossWithSVLS of the official code (kernel size 3, replicate padding), 2D or 3D."""
    dims = logits.ndim - 2
    grid = torch.stack(torch.meshgrid(*[torch.arange(3)] * dims, indexing="ij"), dim=-1).double()
    variance = sigma**2.0
    g = (1.0 / (2.0 * math.pi * variance + 1e-16)) * torch.exp(-((grid - 1.0) ** 2).sum(-1) / (2 * variance + 1e-16))
    g = g / g.sum()
    centre = (1,) * dims
    neighbors_sum = 1 - g[centre]
    g[centre] = neighbors_sum
    svls_kernel = g / neighbors_sum
    c = logits.shape[1]
    oh = F.one_hot(labels, c).movedim(-1, 1).double()
    x = F.pad(oh, (1, 1) * dims, mode="replicate")
    conv = F.conv2d if dims == 2 else F.conv3d
    svls_labels = conv(x, svls_kernel.expand(c, 1, *svls_kernel.shape), groups=c) / svls_kernel.sum()
    return (-svls_labels * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


@pytest.mark.parametrize("shape", [(2, 4, 7, 6), (2, 3, 5, 4, 6)])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_matches_published_code(shape, sigma):
    logits, target = random_inputs(shape, seed=41, dtype=torch.float64)
    ours = SVLSLoss(sigma=sigma)(logits, target)
    assert ours.item() == pytest.approx(published_svls(logits, target, sigma).item(), abs=1e-12)
    # float32 path agrees with the float64 reference to 1e-6
    ours32 = SVLSLoss(sigma=sigma)(logits.float(), target)
    assert ours32.item() == pytest.approx(published_svls(logits, target, sigma).item(), abs=1e-6)


def loop_svls(logits, target, size, sigma, ignore_index=None):
    """Per voxel: q = sum of the weights of the (clamped = replicate) neighbours' labels, over non-ignored ones."""
    z = logits.double().numpy()
    y = target.numpy()
    b, c, *spatial = z.shape
    r = size // 2
    offsets = list(itertools.product(range(-r, r + 1), repeat=len(spatial)))

    def weight(o):
        if not any(o):
            return None
        return math.exp(-sum(v * v for v in o) / (2 * sigma**2))

    neigh = sum(weight(o) for o in offsets if any(o))
    total, count = 0.0, 0
    for n in range(b):
        for pos in itertools.product(*[range(s) for s in spatial]):
            if ignore_index is not None and y[(n, *pos)] == ignore_index:
                continue
            q = np.zeros(c)
            for o in offsets:
                w = neigh if not any(o) else weight(o)
                p = tuple(min(max(pos[i] + o[i], 0), spatial[i] - 1) for i in range(len(spatial)))
                label = y[(n, *p)]
                if ignore_index is not None and label == ignore_index:
                    continue
                q[label] += w
            q /= q.sum()
            zz = z[(n, slice(None), *pos)]
            logp = zz - zz.max() - math.log(np.exp(zz - zz.max()).sum())
            total -= float((q * logp).sum())
            count += 1
    return total / count


@pytest.mark.parametrize("shape", [(2, 3, 6, 5), (1, 3, 4, 5, 4)])
def test_matches_loop_for_larger_windows_and_ignored_voxels(shape):
    logits, target = random_inputs(shape, seed=42, dtype=torch.float64)
    target[0, 1] = 255
    loss = SVLSLoss(kernel_size=5, sigma=1.5, ignore_index=255)
    assert loss(logits, target).item() == pytest.approx(loop_svls(logits, target, 5, 1.5, 255), abs=1e-10)
    assert SVLSLoss(sigma=0.7)(logits, target.clamp(max=2)).item() == pytest.approx(
        loop_svls(logits, target.clamp(max=2), 3, 0.7), abs=1e-10
    )


# ------------------------------------------------------------------ hand values and limits
def one_row(a):
    """1 x 2 x 1 x 3 logits with z = (0, a_x) at voxel x, and the labels 0, 1, 1."""
    logits = torch.tensor([[[[0.0, 0.0, 0.0]], [list(a)]]], dtype=torch.float64)
    return logits, torch.tensor([[[0, 1, 1]]])


def nll2(a, q1):
    """-[(1 - q1) log p0 + q1 log p1] for z = (0, a)."""
    lse = math.log(1 + math.exp(a))
    return (1 - q1) * lse + q1 * (lse - a)


def test_hand_value_on_one_row():
    # H = 1: replicate padding repeats the row, so a column of the 3x3 window weighs
    # e + 2c (side) or 1/2 + 2e (centre) with e = edge, c = corner weights
    a = (0.3, -1.2, 2.0)
    e, c = math.exp(-0.5), math.exp(-1.0)
    e, c = e / (2 * (4 * e + 4 * c)), c / (2 * (4 * e + 4 * c))
    side = e + 2 * c
    q1 = [side, 1 - side, 1.0]  # share of class 1 at x = 0, 1, 2
    expected = sum(nll2(a[x], q1[x]) for x in range(3)) / 3
    logits, target = one_row(a)
    assert SVLSLoss()(logits, target).item() == pytest.approx(expected, rel=1e-12)
    # sigma -> 0: face neighbours 1/8 each, so a side column weighs 1/8 (the corners vanish)
    q1 = [1 / 8, 7 / 8, 1.0]
    expected0 = sum(nll2(a[x], q1[x]) for x in range(3)) / 3
    assert SVLSLoss(sigma=1e-4)(logits, target).item() == pytest.approx(expected0, rel=1e-12)
    # ... which is NOT cross-entropy at a label boundary (the centre weight stays 1/2)
    assert abs(expected0 - CELoss()(logits, target).item()) > 1e-2


def test_hand_value_with_an_ignored_neighbour():
    # labels 0, ignored, 1: each kept voxel sees only its own class -> q is one-hot -> CE
    logits, _ = one_row((0.3, -1.2, 2.0))
    target = torch.tensor([[[0, 255, 1]]])
    expected = (nll2(0.3, 0.0) + nll2(2.0, 1.0)) / 2
    assert SVLSLoss(ignore_index=255)(logits, target).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (2, 3, 4, 3, 5)])
def test_uniform_label_maps_give_ce(shape):
    logits, _ = random_inputs(shape, seed=43)
    target = torch.zeros((shape[0], *shape[2:]), dtype=torch.long)
    target[1] = 2
    for sigma in (0.1, 1.0, 5.0):
        assert torch.allclose(SVLSLoss(sigma=sigma)(logits, target), CELoss()(logits, target), rtol=1e-6)


def test_soft_target_is_a_distribution():
    logits, target = random_inputs((2, 4, 6, 6), seed=44)
    target[0, 0, 0] = 255
    valid = target != 255
    loss = SVLSLoss(kernel_size=5, ignore_index=255)
    q = loss.soft_target(torch.where(valid, target, 0), valid, 4, torch.float64)
    assert torch.allclose(q.sum(1)[valid], torch.ones(()).double())
    assert (q >= 0).all()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"kernel_size": 4}, "kernel_size"),
        ({"kernel_size": 1}, "kernel_size"),
        ({"kernel_size": 3.0}, "kernel_size"),
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": -1.0}, "sigma"),
    ],
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SVLSLoss(**kwargs)


def test_rejects_1d_inputs():
    with pytest.raises(ValueError, match="2 or 3 spatial"):
        SVLSLoss()(torch.zeros(1, 2, 5), torch.zeros(1, 5, dtype=torch.long))

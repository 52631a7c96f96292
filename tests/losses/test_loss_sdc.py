"""SDC: a value by hand; the authors' computation (OpenCV morphology and box mean, done here with SciPy's
binary morphology and mirrored uniform filter; their slice loop; their per-class SciPy signed distances) re-derived
and compared in value and gradient, 2D and 3D, with absent classes; the absent-class difference shown."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage

from .loss_zoo import random_inputs
from mcseg.losses import SDCLoss
from mcseg.losses.sdc import MORPHOLOGIES


def test_value_by_hand():
    # 7 x 7, one voxel of class 1 at the centre, zero logits (p = 1/2). The gradient band of either class is the
    # 3 x 3 block around the centre; its box mean reaches the 5 x 5 block, where both classes share it equally
    # (t = 1/2, 1/2: no L1 term); the 24 border voxels get t = 0 (L1 term 1/2). phi_1 = distance to the centre /
    # max, -1 / max at the centre (max = sqrt(18) + 1e-6), phi_0 = -phi_1.
    target = torch.zeros(1, 7, 7, dtype=torch.long)
    target[0, 3, 3] = 1
    logits = torch.zeros(1, 2, 7, 7, dtype=torch.float64)
    loss = SDCLoss()
    t, phi = loss.targets(target, None, 2, torch.float64)
    inner = torch.zeros(7, 7, dtype=torch.bool)
    inner[1:6, 1:6] = True
    assert torch.equal(t[0, :, inner], torch.full((2, 25), 0.5, dtype=torch.float64))
    assert torch.equal(t[0, :, ~inner], torch.zeros(2, 24, dtype=torch.float64))
    top = math.sqrt(18) + 1e-6
    distance = [math.hypot(i - 3, j - 3) or 1.0 for i in range(7) for j in range(7)]
    assert phi[0, 1].reshape(-1).tolist() == pytest.approx([(-d if d == 1.0 and k == 24 else d) / top
                                                            for k, d in enumerate(distance)], rel=1e-12)
    assert torch.equal(phi[0, 0], -phi[0, 1])
    expected = math.log(2) + 0.1 * 24 * 0.5 / 49 + 0.1 / 100 * sum(distance) / top / 49
    assert loss(logits, target).item() == pytest.approx(expected, rel=1e-12)
    # L2: squares instead
    expected = math.log(2) + 0.1 * 24 * 0.25 / 49 + 0.1 / 100 * sum(d * d for d in distance) / top**2 / 49
    assert SDCLoss(dist="l2")(logits, target).item() == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------------ the authors' computation, re-derived
SQUARE = np.ones((3, 3), dtype=bool)


def authors_morphology(mask, op):
    """``apply_morphology``: OpenCV's 3 x 3 operations, whose default borders leave outside pixels out (an
    erosion sees 1 outside, a dilation 0)."""
    erode = lambda m: ndimage.binary_erosion(m, SQUARE, border_value=1)  # noqa: E731
    dilate = lambda m: ndimage.binary_dilation(m, SQUARE, border_value=0)  # noqa: E731
    out = {
        "erosion": lambda: erode(mask),
        "dilation": lambda: dilate(mask),
        "opening": lambda: dilate(erode(mask)),
        "closing": lambda: erode(dilate(mask)),
        "internal_boundary": lambda: mask & ~erode(mask),
        "external_boundary": lambda: dilate(mask) & ~mask,
        "gradient": lambda: dilate(mask) & ~erode(mask),
    }[op]()
    return out.astype(np.float32)


def authors_adaptive_target(labels, num_classes, morph="gradient"):
    """``build_adaptive_target`` with the mean kernel (``cv2.blur`` 3 x 3, BORDER_REFLECT_101 = SciPy's
    ``mirror``): per image and class, slice by slice along the first spatial axis for volumes; normalised over
    the classes with the sum clamped to 1e-6."""
    out = []
    for lab in labels.numpy():
        slices = [lab] if lab.ndim == 2 else list(lab)
        maps = [np.stack([ndimage.uniform_filter(authors_morphology(s == c, morph), 3, mode="mirror")
                          for s in slices]) for c in range(num_classes)]
        out.append(np.stack([m[0] if lab.ndim == 2 else m for m in maps]))
    tgt = torch.from_numpy(np.stack(out)).float()
    return tgt / tgt.sum(dim=1, keepdim=True).clamp_min(1e-6)


def authors_sdf(labels, num_classes, absent="authors"):
    """``multiclass_sdf_targets``: per image and class ``edt(~m) - edt(m)`` (float32), divided by max |.| + 1e-6.
    ``absent="mcseg"``: a class absent from the image is +1 (filling it: -1), mcseg's policy."""
    out = []
    for lab in labels.numpy():
        maps = []
        for c in range(num_classes):
            m = lab == c
            sdf = (ndimage.distance_transform_edt(~m) - ndimage.distance_transform_edt(m)).astype(np.float32)
            sdf = sdf / (np.max(np.abs(sdf)) + 1e-6)
            if absent == "mcseg" and (not m.any() or m.all()):
                sdf = np.full(m.shape, 1.0 if not m.any() else -1.0, dtype=np.float32)
            maps.append(sdf)
        out.append(np.stack(maps))
    return torch.from_numpy(np.stack(out)).float()


def authors_sdc(logits, labels, absent="authors", morph="gradient", alpha=0.1, lam_sdf=0.1, sdf_scale=100.0):
    """``sdc_loss`` (L1): CE + alpha mean |t - p| + lam_sdf L1(2p - 1, phi) / sdf_scale, every mean over all
    elements. Volumes in their layout ``N x D x H x W`` (the slice axis first)."""
    probs = F.softmax(logits, dim=1)
    t = authors_adaptive_target(labels, logits.shape[1], morph).to(logits.dtype)
    phi = authors_sdf(labels, logits.shape[1], absent).to(logits.dtype)
    return (F.cross_entropy(logits, labels) + alpha * (t - probs).abs().mean()
            + lam_sdf * F.l1_loss(2.0 * probs - 1.0, phi) / sdf_scale)


def _inputs(shape, seed):
    """Random logits and labels of C = 4 classes with class 3 absent everywhere, class 2 absent from the first
    image, a uniform block (region interiors) and, in the second image, a class on one voxel."""
    logits, target = random_inputs(shape, seed=seed, dtype=torch.float64, scale=3.0, num_classes=3)
    target[0][target[0] == 2] = 1
    target[1, :3, :3] = 0
    target[1, 0, 0] = 2
    return logits, target


@pytest.mark.parametrize("morph", MORPHOLOGIES)
@pytest.mark.parametrize("dims", ["2d", "3d"])
def test_equals_the_authors_computation_value_and_gradient(dims, morph):
    """mcseg's B x C x H x W x D is the authors' N x C x D x H x W with D moved first (both slice along D)."""
    if dims == "2d":
        logits, target = _inputs((2, 4, 9, 8), seed=3)
        theirs_view = lambda z, y: (z, y)  # noqa: E731
    else:
        logits, target = _inputs((2, 4, 8, 7, 3), seed=4)
        theirs_view = lambda z, y: (z.permute(0, 1, 4, 2, 3), y.permute(0, 3, 1, 2))  # noqa: E731
    ours_z, theirs_z = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ours = SDCLoss(sam_morph=morph)(ours_z, target)
    theirs = authors_sdc(*theirs_view(theirs_z, target), absent="mcseg", morph=morph)
    # their targets are float32 (OpenCV / .float()): a rounding of the targets apart
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-7)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_z.grad, theirs_z.grad, rtol=1e-6, atol=1e-9)


def test_the_absent_class_difference():
    """Their SDF of an absent class measures the distance to a phantom voxel outside the array's first corner,
    at (-1, 0) (SciPy's transform of a mask without background): normalised, a map rising along both axes, not a
    constant. That channel is the only difference; without absent classes the values agree."""
    logits, target = _inputs((2, 4, 9, 8), seed=3)
    theirs = authors_sdf(target, 4)[1, 3]  # class 3 is absent
    i, j = torch.meshgrid(torch.arange(9.0), torch.arange(8.0), indexing="ij")
    corner = torch.hypot(i + 1, j)
    torch.testing.assert_close(theirs, corner / (corner.max() + 1e-6))
    assert (theirs.diff(dim=0) > 0).all() and (theirs.diff(dim=1) > 0).all()  # rising along both axes
    assert theirs.min() < 0.1 and theirs.max() == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(SDCLoss().targets(target, None, 4, torch.float32)[1][1, 3], torch.ones(9, 8))
    assert SDCLoss()(logits, target).item() != pytest.approx(authors_sdc(logits, target).item(), rel=1e-7)
    logits, target = random_inputs((2, 3, 9, 8), seed=5, dtype=torch.float64)
    assert all(len(target[b].unique()) == 3 for b in range(2))
    assert SDCLoss()(logits, target).item() == pytest.approx(authors_sdc(logits, target).item(), rel=1e-7)


def test_soft_targets_are_refused_naming_the_key():
    logits = torch.randn(1, 3, 4, 4)
    with pytest.raises(ValueError, match=r"loss SDCLoss needs a hard label per voxel and refuses "
                                         r"dataset.raters.target=mean"):
        SDCLoss()(logits, torch.softmax(torch.randn(1, 3, 4, 4), 1))


@pytest.mark.parametrize("kwargs, name", [({"sam_morph": "tophat"}, "sam_morph"), ({"sam_kernel": "gaussian"},
                                          "sam_kernel"), ({"dist": "l3"}, "dist"), ({"sdf_scale": 0.0}, "sdf_scale"),
                                          ({"alpha": -1.0}, "alpha")])
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SDCLoss(**kwargs)


@pytest.mark.parametrize("shape", [(2, 3, 9, 7), (1, 2, 6, 5, 4)], ids=["2d", "3d"])
def test_device_distance_is_scipys_exact_transform_in_any_chunking(shape, monkeypatch):
    from mcseg.losses import sdc

    g = torch.Generator().manual_seed(6)
    feature = torch.rand(shape, generator=g) < 0.1
    feature[0, 0] = False  # no feature voxel: 0 by convention
    expected = np.zeros(shape)
    for index in np.ndindex(*shape[:2]):
        if feature[index].any():
            expected[index] = ndimage.distance_transform_edt(~feature[index].numpy())
    torch.testing.assert_close(sdc.distance_to(feature, torch.float64), torch.from_numpy(expected), rtol=1e-15, atol=0)
    monkeypatch.setattr(sdc, "_CHUNK", 10)  # one line per chunk
    torch.testing.assert_close(sdc.distance_to(feature, torch.float64), torch.from_numpy(expected), rtol=1e-15, atol=0)

"""CRaC: a value and a gradient by hand; the boundary test; the authors' computation (their unfold, class shares,
region columns, PHR penalty and multiplier updates) re-derived and compared in value, gradient and updates, 2D and
3D, with absent classes; their float32-rounding boundary test, the one difference; an exact resume of the state."""

import math

import pytest
import torch
import torch.nn.functional as F

from .loss_zoo import random_inputs
from mcseg.losses import CRaCLoss
from mcseg.losses.crac import several_labels

LMIN = 1e-6


def phr(h, lam, rho):
    return (max(0.0, lam + rho * h) ** 2 - lam**2) / (2 * rho)


def test_value_and_gradient_by_hand():
    # one 1 x 5 image, labels [1, 0, 0, 0, 0], zero logits, C = 2. The zero-padded 3 x 3 windows: voxels 0 and 1
    # see the label 1 (boundary, shares s = (8/9, 1/9)); voxels 2-4 see only 0 (interior, target (5, 0)).
    target = torch.tensor([[[1, 0, 0, 0, 0]]])
    logits = torch.zeros(1, 2, 1, 5, dtype=torch.float64, requires_grad=True)
    loss = CRaCLoss(num_classes=2)
    rho = 0.1
    penalty = (2 * (phr(8 / 9, LMIN, rho) + phr(1 / 9, LMIN, rho)) + 3 * phr(5.0, LMIN, rho)) / (4 * 5)
    value = loss(logits, target)
    assert value.item() == pytest.approx(math.log(2) + penalty, rel=1e-12)
    value.backward()
    # d/dz_k at an interior voxel of class 0: (p_0 - 1) / 5 - P'(5) / (5 * 4); class 1: p_1 / 5 (h = 0, no pull)
    grad = logits.grad[0, :, 0, 2].tolist()
    assert grad == pytest.approx([-0.5 / 5 - (LMIN + rho * 5.0) / 20, 0.5 / 5], rel=1e-12)
    # at a boundary voxel, class 1: z < s_1 so the pull is -P'(1/9)
    assert logits.grad[0, 1, 0, 0].item() == pytest.approx(-0.5 / 5 - (LMIN + rho / 9) / 20, rel=1e-12)
    # other multipliers: boundary columns first
    loss.lambd.copy_(torch.tensor([0.5, 2.0, 1.0, 3.0]))
    penalty = (2 * (phr(8 / 9, 0.5, rho) + phr(1 / 9, 2.0, rho)) + 3 * phr(5.0, 1.0, rho)) / 20
    assert loss(logits, target).item() == pytest.approx(math.log(2) + penalty, rel=1e-12)


def brute_several_labels(target):
    """Per voxel: the labels of its 3^d window (outside = 0) are not all equal; Python loops."""
    out = torch.zeros(target.shape, dtype=torch.bool)
    spatial = target.shape[1:]
    for b in range(target.shape[0]):
        for index in torch.cartesian_prod(*[torch.arange(n) for n in spatial]).view(-1, len(spatial)).tolist():
            seen = set()
            for offset in torch.cartesian_prod(*[torch.arange(-1, 2)] * len(spatial)).view(-1, len(spatial)).tolist():
                q = [i + o for i, o in zip(index, offset)]
                inside = all(0 <= x < n for x, n in zip(q, spatial))
                seen.add(int(target[(b, *q)]) if inside else 0)
            out[(b, *index)] = len(seen) > 1
    return out


@pytest.mark.parametrize("shape", [(2, 5, 6), (1, 4, 3, 5)], ids=["2d", "3d"])
def test_boundary_is_a_window_with_several_labels(shape):
    target = torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(3))
    target[0, :2] = 2  # a uniform patch
    assert torch.equal(several_labels(target, None)[:, 0], brute_several_labels(target))


# ------------------------------------------------------------------ the authors' computation, re-derived
def _windows(target):
    """The labels of every voxel's 3^d window, zero-padded (their ``nn.Unfold(3, padding=1)``, generalised to
    3D): ``B x spatial x 3^d`` floats."""
    x = F.pad(target.double(), (1, 1) * (target.ndim - 1))
    for dim in range(1, target.ndim):
        x = x.unfold(dim, 3, 1)
    return x.reshape(*target.shape, -1)


def authors_columns(logits, target, margin, boundary="rounding"):
    """``hcat`` of ``get``: their class shares, ``|m r - z|`` / ``|r - z|`` by region, [h b, h (1 - b)] (classes
    last). ``boundary="rounding"``: their test ``sum(mean(u) - u) != 0`` in float32 (their labels are float32);
    ``"mixed"``: the window holds several labels (ours)."""
    u = _windows(target)
    c = logits.shape[1]
    r = torch.stack([(u == k).sum(-1).to(logits.dtype) / u.shape[-1] for k in range(c)], dim=1)
    easy, diff = (margin * r - logits).abs(), (r - logits).abs()
    if boundary == "rounding":
        u32 = u.float()
        reg = ((u32.mean(-1, keepdim=True) - u32).sum(-1) != 0)
    else:
        reg = u.amax(-1) != u.amin(-1)
    reg = reg.unsqueeze(1).to(logits.dtype)
    h = (reg * diff + (1 - reg) * easy).movedim(1, -1)
    reg = reg.movedim(1, -1)
    return torch.cat([h * reg, h * (1 - reg)], -1)


def authors_phr(h, lam, rho):
    x = lam + rho * h
    y = torch.where(x >= 0, (x**2 - lam**2) / (2 * rho), -(lam**2) / (2 * rho))
    grad = torch.where(x >= 0, x, torch.zeros_like(h))
    return y, grad


def authors_loss(logits, target, lam, rho, margin):
    """Their training objective: ``CrossEntropyLoss()(z, y) + get(z, y)[0]``."""
    penalty, _ = authors_phr(authors_columns(logits, target, margin, "mixed"), lam, rho)
    return F.cross_entropy(logits, target) + penalty.mean()


class AuthorsMultipliers:
    """``reset_update_lambd`` / ``update_lambd`` / ``set_lambd`` / ``update_rho`` of their class."""

    def __init__(self, k, rho_min, rho_step, lmin=LMIN, lmax=1e6, rho_max=10.0, gamma=1.2, tao=0.9):
        self.lam, self.rho = torch.full((2 * k,), lmin, dtype=torch.float64), torch.full((2 * k,), rho_min,
                                                                                           dtype=torch.float64)
        self.lmin, self.lmax, self.rho_min, self.rho_max = lmin, lmax, rho_min, rho_max
        self.rho_step, self.gamma, self.tao, self.prev = rho_step, gamma, tao, None

    def epoch(self, epoch, batches, margin):
        grad_sum, count, constraints = torch.zeros_like(self.lam), 0, torch.zeros_like(self.rho)
        for logits, target in batches:
            hcat = authors_columns(logits.double(), target, margin, "mixed")
            _, grad = authors_phr(hcat, self.lam, self.rho)
            grad = grad.clamp(self.lmin, self.lmax).flatten(0, -2)
            grad_sum += grad.sum(0)
            count += grad.shape[0]
            constraints += hcat.flatten(0, -2).sum(0)
        self.lam = (grad_sum / count).clamp(self.lmin, self.lmax)
        current = constraints / count
        if (epoch + 1) % self.rho_step == 0 and self.prev is not None:
            self.rho = torch.where(current > self.prev.clamp(min=0) * self.tao, self.gamma * self.rho, self.rho)
            self.rho = self.rho.clamp(self.rho_min, self.rho_max)
        self.prev = current


SHAPES = {"2d": (2, 4, 6, 7), "3d": (2, 4, 4, 5, 3)}


def _labels_without_class_3(shape, seed):
    """Random labels of C = 4 classes in which class 3 is absent everywhere and class 2 from the first image."""
    logits, target = random_inputs(shape, seed=seed, dtype=torch.float64, scale=4.0, num_classes=3)
    target[0][target[0] == 2] = 1
    target[1, :2] = 0  # a uniform block: interior voxels too
    return logits, target


@pytest.mark.parametrize("dims", SHAPES)
def test_equals_the_authors_computation_value_and_gradient(dims):
    logits, target = _labels_without_class_3(SHAPES[dims], seed=7)
    loss = CRaCLoss(num_classes=4, margin=5.0, rho_min=0.1)
    g = torch.Generator().manual_seed(1)
    loss.lambd.copy_(torch.rand(8, generator=g, dtype=torch.float64) * 2)  # as after some epochs
    loss.rho.copy_(0.1 + torch.rand(8, generator=g, dtype=torch.float64))
    ours_z, theirs_z = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ours = loss(ours_z, target)
    theirs = authors_loss(theirs_z, target, loss.lambd, loss.rho, 5.0)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_z.grad, theirs_z.grad, rtol=1e-10, atol=1e-15)
    # float32 (their setting): the shares are a convolution here, a count / 9 there (a rounding apart)
    ours32 = CRaCLoss(num_classes=4)(logits.float(), target)
    theirs32 = authors_loss(logits.float(), target, torch.full((8,), LMIN), torch.full((8,), 0.1), 5.0)
    assert ours32.item() == pytest.approx(theirs32.item(), rel=1e-6)


@pytest.mark.parametrize("dims", SHAPES)
def test_multiplier_updates_equal_the_authors_over_epochs(dims):
    loss = CRaCLoss(num_classes=4, rho_step=2)
    theirs = AuthorsMultipliers(4, rho_min=0.1, rho_step=2)
    for epoch in range(5):
        batches = [_labels_without_class_3(SHAPES[dims], seed=10 * epoch + i) for i in range(2)]
        batches = [(z.float() * (1 + epoch), y) for z, y in batches]  # the constraints change between epochs
        loss.on_validation_start()
        for z, y in batches:
            loss.on_validation_batch(z, y)
        loss.on_validation_end(epoch)
        theirs.epoch(epoch, batches, 5.0)
        torch.testing.assert_close(loss.lambd, theirs.lam, rtol=1e-9, atol=0)
        torch.testing.assert_close(loss.rho, theirs.rho, rtol=1e-12, atol=0)
    assert (loss.rho > 0.1).all() and (loss.lambd > LMIN).all()  # rho grew; even absent classes' (target 0)
    assert not torch.allclose(loss.lambd[:4], loss.lambd[4:])  # boundary and interior multipliers differ


def test_the_authors_boundary_test_is_float_rounding():
    """Their ``sum_i (mean u - u_i) != 0`` is 0 in exact arithmetic: a mixed window (six 0s above three 3s)
    rounds to exactly 0 and gets the interior target m r; ours calls it a boundary (the one difference)."""
    target = torch.tensor([[[0, 0, 0], [0, 0, 0], [3, 3, 3], [3, 3, 3]]])
    logits = torch.zeros(1, 4, 4, 3, dtype=torch.float64)
    theirs, ours = authors_columns(logits, target, 5.0, "rounding"), authors_columns(logits, target, 5.0, "mixed")
    # the voxel (1, 1): window rows 0-2, r = (6/9, 0, 0, 3/9)
    assert theirs[0, 1, 1, :4].abs().sum() == 0  # their boundary columns are empty: called interior
    assert theirs[0, 1, 1, 4:].tolist() == pytest.approx([5 * 6 / 9, 0, 0, 5 * 3 / 9], rel=1e-12)
    assert ours[0, 1, 1, :4].tolist() == pytest.approx([6 / 9, 0, 0, 3 / 9], rel=1e-12)
    h = CRaCLoss(num_classes=4).constraint_columns(logits, target, None)
    assert h[0, :, 1, 1].tolist() == pytest.approx(ours[0, 1, 1].tolist(), rel=1e-12)
    # elsewhere on random windows the two agree mostly, not always
    _, target = random_inputs((1, 3, 40, 40), seed=2)
    agree = (authors_columns(torch.zeros(1, 3, 40, 40), target, 5.0, "rounding")
             == authors_columns(torch.zeros(1, 3, 40, 40), target, 5.0, "mixed")).all(-1).float().mean()
    assert 0.5 < agree < 1


# ------------------------------------------------------------------ state
def _validate(loss, epoch, seed):
    loss.on_validation_start()
    for i in range(2):
        z, y = _labels_without_class_3(SHAPES["2d"], seed=seed + i)
        loss.on_validation_batch(z.float() * (1 + epoch), y)
    loss.on_validation_end(epoch)


def test_an_exact_resume_from_the_state_dict():
    """Epochs 0-5 in one go, or 0-2, a checkpoint (state_dict through torch.save) and 3-5 in a new loss: the same
    multipliers, rho (an update at epoch 3 and 5, so prev_constraint must come back too) and training value."""
    through = CRaCLoss(num_classes=4, rho_step=2)
    for epoch in range(6):
        _validate(through, epoch, seed=100 + epoch)
    first = CRaCLoss(num_classes=4, rho_step=2)
    for epoch in range(3):
        _validate(first, epoch, seed=100 + epoch)
    import io

    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = CRaCLoss(num_classes=4, rho_step=2)
    resumed.load_state_dict(torch.load(buffer))
    for epoch in range(3, 6):
        _validate(resumed, epoch, seed=100 + epoch)
    assert set(resumed.state_dict()) == {"lambd", "rho", "prev_constraint", "has_prev_constraint"}
    for key, value in through.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    assert not torch.equal(through.rho, torch.full((8,), 0.1, dtype=torch.float64))
    z, y = _labels_without_class_3(SHAPES["2d"], seed=1)
    assert torch.equal(through(z, y), resumed(z, y))


def test_soft_targets_are_refused_naming_the_key():
    logits = torch.randn(1, 3, 4, 4)
    q = torch.softmax(torch.randn(1, 3, 4, 4), 1)
    with pytest.raises(ValueError, match=r"loss CRaCLoss needs a hard label per voxel and refuses "
                                         r"dataset.raters.target=mean"):
        CRaCLoss(num_classes=3)(logits, q)


@pytest.mark.parametrize("kwargs, name", [({"margin": 0.0}, "margin"), ({"rho_min": 0.0}, "rho_min"),
                                          ({"num_classes": 1}, "num_classes"), ({"gamma": 0.5}, "gamma")])
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CRaCLoss(**{"num_classes": 3, **kwargs})


def test_wrong_number_of_classes_is_named():
    with pytest.raises(ValueError, match="CRaCLoss has num_classes=4 but logits have C=3"):
        CRaCLoss(num_classes=4)(*random_inputs((1, 3, 4, 4)))


@pytest.mark.parametrize("slice_axis", [0, -1])
def test_a_2d_network_validated_on_volumes_is_windowed_slice_by_slice(slice_axis):
    """Trained on 2D slices (dims 2), validated on 1 x C x X x Y x Z volumes (the trainer's hook): the regions and
    shares are those of the volume's slices along ``slice_axis`` (as the authors validate, a batch of slices), not
    of 3D windows, so the multipliers see the constraints the training penalises."""
    z, y = random_inputs((1, 4, 5, 6, 4), seed=20, dtype=torch.float64, scale=4.0, num_classes=3)
    y[0, :2, :3] = 0  # a uniform block: interior voxels in 3D and 2D windows
    volume = CRaCLoss(num_classes=4, dims=2, slice_axis=slice_axis)
    slices = CRaCLoss(num_classes=4)
    axis = slice_axis % 3
    for loss, inputs in ((volume, (z, y)), (slices, (z.movedim(2 + axis, 0)[:, 0], y.movedim(1 + axis, 0)[:, 0]))):
        loss.on_validation_start()
        loss.on_validation_batch(*inputs)
        loss.on_validation_end(0)
    torch.testing.assert_close(volume.lambd, slices.lambd, rtol=1e-12, atol=0)
    torch.testing.assert_close(volume.prev_constraint, slices.prev_constraint, rtol=1e-12, atol=0)
    windows3d = CRaCLoss(num_classes=4)
    windows3d.on_validation_start()
    windows3d.on_validation_batch(z, y)
    windows3d.on_validation_end(0)
    assert not torch.allclose(windows3d.lambd, slices.lambd)  # 3D windows would give other multipliers
    # a 3D network (dims 3) keeps 3D windows; training batches (B x C x H x W) are never sliced
    with pytest.raises(ValueError, match="dims"):
        CRaCLoss(num_classes=4, dims=4)

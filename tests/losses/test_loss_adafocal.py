"""AdaFocal: the loss by hand and against a per-voxel loop re-derived from the paper's code, the gamma
update (equal-mass edges, gaps, switch to inverse focal, clipping) on hand-made validation batches,
the voxel subsample, and the checkpointed state."""

import io
import math

import numpy as np
import pytest
import torch

from .loss_zoo import random_inputs
from mcseg.losses import AdaFocalLoss


def binary_logits(p_class0, dtype=torch.float64):
    """1 x 2 x N logits whose softmax gives p(class 0) = p_class0."""
    p = torch.tensor(p_class0, dtype=torch.float64)
    return torch.stack([p.log(), (1 - p).log()]).unsqueeze(0).to(dtype)


def with_state(loss, gamma, edges):
    loss.gamma.copy_(torch.tensor(gamma, dtype=torch.float64))
    loss.edges.copy_(torch.tensor(edges, dtype=torch.float64))
    return loss


# ------------------------------------------------------------------ the loss
def test_value_by_hand_focal_and_inverse_focal():
    # K = 3 bins [0, .3), [.3, .6), [.6, 1] with gamma 2, -1 (inverse focal), 0.5
    loss = with_state(AdaFocalLoss(num_bins=3, reduction="sum"), [2.0, -1.0, 0.5], [0.0, 0.3, 0.6, 1.0])
    logits = binary_logits([0.2, 0.5, 0.9])
    target = torch.zeros(1, 3, dtype=torch.long)  # p_t = 0.2, 0.5, 0.9
    expected = [-(0.8**2) * math.log(0.2), -(1.5**1) * math.log(0.5), -(0.1**0.5) * math.log(0.9)]
    assert loss(logits, target).item() == pytest.approx(sum(expected), rel=1e-12)
    mean = with_state(AdaFocalLoss(num_bins=3), [2.0, -1.0, 0.5], [0.0, 0.3, 0.6, 1.0])
    assert mean(logits, target).item() == pytest.approx(sum(expected) / 3, rel=1e-12)
    # the bin is chosen by the TRUE-class probability: label 1 gives p_t = 0.8, 0.5, 0.1
    expected = [-(0.2**0.5) * math.log(0.8), -1.5 * math.log(0.5), -(0.9**2) * math.log(0.1)]
    assert loss(logits, torch.ones(1, 3, dtype=torch.long)).item() == pytest.approx(sum(expected), rel=1e-12)


def test_bin_lookup_half_open_with_open_ends_and_repeated_edges():
    loss = with_state(AdaFocalLoss(num_bins=5), [0.0] * 5, [0.2, 0.5, 0.9, 0.9, 0.95, 0.97])
    p = torch.tensor([0.0, 0.1, 0.5, 0.7, 0.9, 0.93, 0.95, 0.99, 1.0], dtype=torch.float64)
    # below the first edge -> bin 0; 0.5 is a lower edge -> bin 1; 0.9 -> the last of the bins starting there
    assert loss.bin_of(p).tolist() == [0, 0, 1, 1, 3, 3, 4, 4, 4]


def test_gamma_zero_is_ce_and_p_t_one_keeps_finite_gradients():
    logits, target = random_inputs((2, 3, 4, 5), seed=3)
    loss = with_state(AdaFocalLoss(num_bins=1), [0.0], [0.0, 1.0])
    ce = torch.nn.functional.cross_entropy(logits, target)
    assert loss(logits, target).item() == pytest.approx(ce.item(), rel=1e-6)
    # p_t == 1 exactly in float32 with 0 < gamma < 1: the 1e-20 keeps the gradient finite
    sharp = torch.tensor([[[60.0], [0.0]]], requires_grad=True)
    small = with_state(AdaFocalLoss(num_bins=1), [0.2], [0.0, 1.0])
    small(sharp, torch.zeros(1, 1, dtype=torch.long)).backward()
    assert torch.isfinite(sharp.grad).all()


def loop_adafocal(logits, target, gamma, edges):
    """Per voxel, in Python: the bin search (first bin open below, last open above, else lo <= p_t < hi)
    and -(1 - sign(g) p_t + 1e-20)^|g| log p_t, summed (the authors' reduction)."""
    c = logits.shape[1]
    z = logits.movedim(1, -1).reshape(-1, c).tolist()
    y = target.reshape(-1).tolist()
    k = len(gamma)
    total = 0.0
    for row, label in zip(z, y):
        m = max(row)
        log_p_t = row[label] - m - math.log(sum(math.exp(v - m) for v in row))
        p_t = math.exp(log_p_t)
        for b in range(k):
            if (b == 0 and p_t < edges[1]) or (b == k - 1 and p_t >= edges[k - 1]):
                break
            if edges[b] <= p_t < edges[b + 1]:
                break
        g = gamma[b]
        sign = (g > 0) - (g < 0)
        total += -((1 - sign * p_t + 1e-20) ** abs(g)) * log_p_t
    return total


@pytest.mark.parametrize("shape", [(2, 3, 5, 6), (2, 4, 3, 4, 3)])
def test_matches_a_per_voxel_loop(shape):
    logits, target = random_inputs(shape, seed=11, dtype=torch.float64)
    gamma = [3.0, -2.0, 0.2, -0.2, 1.0, 20.0, 0.5]
    edges = [0.0, 0.05, 0.2, 0.2, 0.45, 0.7, 0.9, 1.0]
    loss = with_state(AdaFocalLoss(num_bins=7, reduction="sum"), gamma, edges)
    assert loss(logits, target).item() == pytest.approx(loop_adafocal(logits, target, gamma, edges), rel=1e-12)
    # float32 (the training dtype): same to float rounding; finite gradients
    loss32 = with_state(AdaFocalLoss(num_bins=7), gamma, edges)
    z = logits.float().requires_grad_(True)
    value = loss32(z, target)
    value.backward()
    n = target.numel()
    assert value.item() == pytest.approx(loop_adafocal(logits, target, gamma, edges) / n, rel=1e-5)
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


# ------------------------------------------------------------------ the update
def validate(loss, epoch, volumes):
    loss.on_validation_start()
    for logits, target in volumes:
        loss.on_validation_batch(logits, target)
    loss.on_validation_end(epoch)


def test_update_by_hand():
    # five voxels, confidences 0.6, 0.7, 0.8, 0.9, 0.95 (class 0), correct but the third
    conf = [0.6, 0.7, 0.8, 0.9, 0.95]
    logits = binary_logits(conf)
    target = torch.tensor([[0, 0, 1, 0, 0]])
    loss = AdaFocalLoss(num_bins=2)
    validate(loss, 0, [(logits, target)])
    # edges interp([0, 2.5, 5], [0..4], sorted conf) = (0.6, 0.85, 0.95); bins (0.6, 0.85] = {0.7, 0.8}
    # (0.6 is in no bin) and (0.85, 0.95] = {0.9, 0.95}; gaps 0.75 - 0.5 and 0.925 - 1
    assert loss.edges.tolist() == pytest.approx([0.6, 0.85, 0.95], abs=1e-7)
    assert loss.gamma.tolist() == pytest.approx([math.exp(0.25), math.exp(-0.075)], rel=1e-6)
    assert int(loss.updates) == 1
    # a second epoch on the same batch: gamma_b exp(lambda g_b) again, with lambda = 1
    validate(loss, 1, [(logits, target)])
    assert loss.gamma.tolist() == pytest.approx([math.exp(0.5), math.exp(-0.15)], rel=1e-6)
    # lambda = 2
    twice = AdaFocalLoss(num_bins=2, lambd=2.0)
    validate(twice, 0, [(logits, target)])
    assert twice.gamma.tolist() == pytest.approx([math.exp(0.5), math.exp(-0.15)], rel=1e-6)


@pytest.mark.parametrize("compare", ["float32", "float64", None])
def test_update_compares_in_float32_as_the_authors_or_exactly_in_float64(compare):
    # six validation voxels, class 0's confidences 0.6, 0.7, 0.8, 0.9 (correct), 1 - 2^-23 (wrong) and 1.0
    # (correct): the last two are neighbouring float32 values, as saturated confidences are
    z = binary_logits([0.6, 0.7, 0.8, 0.9], torch.float32)
    z = torch.cat([z, torch.tensor([[[16.0, 20.0], [0.0, 0.0]]])], dim=-1)
    target = torch.tensor([[0, 0, 0, 0, 1, 0]])
    loss = AdaFocalLoss(num_bins=5) if compare is None else AdaFocalLoss(num_bins=5, compare_dtype=compare)
    loss.on_validation_start()
    loss.on_validation_batch(z, target)
    assert loss._conf[-2:].tolist() == [1 - 2**-23, 1.0]
    loss.on_validation_end(0)
    # edges interp(linspace(0, 6, 6), [0..5], conf): 0.6, 0.72, 0.84, 0.96, 1 - 2^-23 + 0.8 * 2^-23, 1;
    # bins 0-2 hold 0.7, 0.8, 0.9 (gaps -0.3, -0.2, -0.1) in both readings
    top = 1 - 2**-23 + 0.8 * 2**-23
    assert loss.edges.tolist() == pytest.approx([0.6, 0.72, 0.84, 0.96, top, 1.0], abs=1e-7)
    assert loss.edges[4].item() == top  # the stored edges stay float64 (the loss's lookup compares in float64)
    if compare == "float64":  # exact: 1 - 2^-23 < edge 4 < 1, so bin 3 = {1 - 2^-23} (gap 1 - 2^-23), bin 4 = {1}
        gaps = [-0.3, -0.2, -0.1, 1 - 2**-23, 0.0]
    else:  # the authors (default): edge 4 rounds to 1.0 in float32, bin 3 = {1 - 2^-23, 1} (gap 0.5 - 2^-24), bin 4 empty
        gaps = [-0.3, -0.2, -0.1, 0.5 - 2**-24, 0.0]
    assert loss.gamma.tolist() == pytest.approx([math.exp(g) for g in gaps], rel=1e-6)
    with pytest.raises(ValueError, match="compare_dtype"):
        AdaFocalLoss(compare_dtype="float16")


def test_switch_to_inverse_focal_and_back():
    loss = AdaFocalLoss(num_bins=4)
    loss.gamma.copy_(torch.tensor([0.21, 0.25, -0.21, -0.21], dtype=torch.float64))
    gaps = torch.tensor([-0.1, -0.1, 0.1, -0.1], dtype=torch.float64)
    # 0.21 e^-0.1 = 0.190 < 0.2 -> -0.2 (inverse focal); 0.25 e^-0.1 = 0.226 stays;
    # -0.21 e^-0.1 = -0.190 -> +0.2 (back to focal); -0.21 e^0.1 = -0.232 stays
    expected = [-0.2, 0.25 * math.exp(-0.1), 0.2, -0.21 * math.exp(0.1)]
    assert loss.updated_gamma(gaps).tolist() == pytest.approx(expected, rel=1e-12)
    # gamma = 0 (a legal gamma_init) switches to +s, as the official "else" branch
    zero = AdaFocalLoss(num_bins=1, gamma_init=0.0)
    assert zero.updated_gamma(torch.tensor([0.3], dtype=torch.float64)).tolist() == [0.2]


def test_switch_through_the_hooks_then_inverse_focal_loss():
    # every voxel confident and wrong: gap > 0 in each bin; gamma 0.21 shrinks below 0.2 -> -0.2
    loss = AdaFocalLoss(num_bins=2, gamma_init=0.21, lambd=0.5)
    conf = [0.6, 0.7, 0.8, 0.9]
    validate(loss, 0, [(binary_logits(conf), torch.ones(1, 4, dtype=torch.long))])
    # edges interp([0, 2, 4], [0..3], conf) = (0.6, 0.8, 0.9): bins (0.6, 0.8] = {0.7, 0.8}, (0.8, 0.9] = {0.9};
    # gaps 0.75 and 0.9: 0.21 e^(0.5 g) grows
    assert loss.edges.tolist() == pytest.approx([0.6, 0.8, 0.9], abs=1e-7)
    assert loss.gamma.tolist() == pytest.approx([0.21 * math.exp(0.375), 0.21 * math.exp(0.45)], rel=1e-6)
    loss.gamma.fill_(0.21)
    validate(loss, 1, [(binary_logits(conf), torch.zeros(1, 4, dtype=torch.long))])
    # now correct: gaps 0.75 - 1 and 0.9 - 1 -> 0.21 e^-0.125 = 0.185 and 0.21 e^-0.05 = 0.1998: both switch
    assert loss.gamma.tolist() == [-0.2, -0.2]
    logits = binary_logits([0.3])
    assert loss(logits, torch.zeros(1, 1, dtype=torch.long)).item() == pytest.approx(
        -(1.3**0.2) * math.log(0.3), rel=1e-12
    )


def test_clipping():
    loss = AdaFocalLoss(num_bins=3)
    loss.gamma.copy_(torch.tensor([15.0, -1.5, 5.0], dtype=torch.float64))
    gaps = torch.tensor([0.5, -0.5, 0.1], dtype=torch.float64)
    assert loss.updated_gamma(gaps).tolist() == pytest.approx([20.0, -2.0, 5.0 * math.exp(0.1)], rel=1e-12)
    narrow = AdaFocalLoss(num_bins=3, gamma_min=-1.0, gamma_max=2.0)
    narrow.gamma.copy_(torch.tensor([1.9, -0.9, 1.0], dtype=torch.float64))
    assert narrow.updated_gamma(gaps).tolist() == pytest.approx([2.0, -1.0, math.exp(0.1)], rel=1e-12)


def loop_update(conf, correct, gamma, k, lambd=1.0, s=0.2, gmin=-2.0, gmax=20.0, compare=np.float32):
    """The update re-derived with numpy and Python loops: equal-mass edges by np.interp, (lo, hi] bins, each
    confidence and edge rounded to ``compare`` for the bin test (float32: the authors' code)."""
    conf = np.asarray(conf, dtype=np.float64)
    edges = np.interp(np.linspace(0, len(conf), k + 1), np.arange(len(conf)), np.sort(conf))
    new = []
    for b in range(k):
        lo, hi = compare(edges[b]), compare(edges[b + 1])
        members = [(c, a) for c, a in zip(conf, correct) if lo < compare(c) <= hi]
        gap = 0.0 if not members else sum(c for c, _ in members) / len(members) - sum(a for _, a in members) / len(members)
        g = gamma[b] * math.exp(lambd * gap) if gamma[b] > 0 else gamma[b] * math.exp(-lambd * gap)
        if abs(g) < s:
            g = -s if g > 0 else s
        new.append(min(max(g, gmin), gmax))
    return new, edges.tolist()


@pytest.mark.parametrize("shape", [(1, 3, 6, 7), (1, 3, 4, 3, 5)])
@pytest.mark.parametrize("compare", ["float32", "float64"])
def test_update_matches_a_loop_over_epochs(shape, compare):
    loss = AdaFocalLoss(num_bins=5, lambd=3.0, compare_dtype=compare)
    gamma = [1.0] * 5
    for epoch in range(6):
        volumes = [random_inputs(shape, seed=10 * epoch + i, scale=1.0 + epoch) for i in range(2)]
        validate(loss, epoch, volumes)
        conf, correct = [], []
        for logits, target in volumes:
            log_conf, pred = torch.log_softmax(logits, 1).max(1)
            conf += log_conf.exp().reshape(-1).tolist()
            correct += (pred == target).reshape(-1).tolist()
        gamma, edges = loop_update(conf, correct, gamma, 5, lambd=3.0, compare=getattr(np, compare))
        assert loss.gamma.tolist() == pytest.approx(gamma, rel=1e-9)
        assert loss.edges.tolist() == pytest.approx(edges, rel=1e-12)
    assert any(g < 0 for g in gamma) or any(g != 1.0 for g in gamma)


# ------------------------------------------------------------------ the validation subsample
def test_subsample_size_seed_and_batch_split():
    logits, target = random_inputs((1, 3, 20, 30), seed=5)
    a = AdaFocalLoss(sample_voxels=100)
    a.on_validation_start()
    a.on_validation_batch(logits, target)
    assert a._conf.shape == (100,)
    a.on_validation_end(0)
    # the same voxels stream in two volumes: the same keys, so the same subsample and update
    b = AdaFocalLoss(sample_voxels=100)
    validate(b, 0, [(logits[..., :13, :], target[:, :13]), (logits[..., 13:, :], target[:, 13:])])
    assert torch.equal(a.gamma, b.gamma) and torch.equal(a.edges, b.edges)
    # another seed, another subsample
    c = AdaFocalLoss(sample_voxels=100, seed=1)
    validate(c, 0, [(logits, target)])
    assert not torch.equal(a.edges, c.edges)
    # a subsample larger than the pass: every voxel, as the official update
    full = AdaFocalLoss(sample_voxels=10_000)
    validate(full, 0, [(logits, target)])
    log_conf, pred = torch.log_softmax(logits, 1).max(1)
    gamma, edges = loop_update(log_conf.exp().reshape(-1).tolist(), (pred == target).reshape(-1).tolist(), [1.0] * 15, 15)
    assert full.gamma.tolist() == pytest.approx(gamma, rel=1e-9)


def test_ignored_voxels_leave_the_update_alone():
    logits, target = random_inputs((1, 3, 6, 7), seed=2)
    plain = AdaFocalLoss(num_bins=4)
    validate(plain, 0, [(logits, target)])
    padded_logits = torch.cat([logits, torch.randn(1, 3, 6, 3) * 9], dim=-1)
    padded_target = torch.cat([target, torch.full((1, 6, 3), 255)], dim=-1)
    ignoring = AdaFocalLoss(num_bins=4, ignore_index=255)
    validate(ignoring, 0, [(padded_logits, padded_target)])
    assert torch.allclose(ignoring.gamma, plain.gamma, rtol=1e-12) and torch.equal(ignoring.edges, plain.edges)


def test_no_validation_voxels_warns_and_keeps_the_state():
    loss = AdaFocalLoss(num_bins=3)
    with pytest.warns(UserWarning, match="no validation voxels"):
        validate(loss, 0, [])
    assert loss.gamma.tolist() == [1.0] * 3 and int(loss.updates) == 0
    with pytest.raises(RuntimeError, match="on_validation_start"):
        AdaFocalLoss().on_validation_batch(*random_inputs((1, 3, 2, 2)))


# ------------------------------------------------------------------ checkpointed state
def test_state_round_trip_resumes_exactly():
    loss = AdaFocalLoss(num_bins=6, sample_voxels=50)
    epochs = [[random_inputs((1, 3, 8, 9), seed=e, scale=2.0 + e)] for e in range(4)]
    for e in range(2):
        validate(loss, e, epochs[e])
    buffer = io.BytesIO()
    torch.save(loss.state_dict(), buffer)
    assert set(loss.state_dict()) == {"gamma", "edges", "updates"}
    resumed = AdaFocalLoss(num_bins=6, sample_voxels=50)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    assert torch.equal(resumed.gamma, loss.gamma) and torch.equal(resumed.edges, loss.edges)
    assert int(resumed.updates) == 2 and not torch.equal(loss.gamma, torch.ones(6, dtype=torch.float64))
    logits, target = random_inputs((2, 3, 5, 6), seed=9)
    assert torch.equal(resumed(logits, target), loss(logits, target))
    # the following epochs (their subsamples are seeded by seed + updates) agree bit for bit
    for e in range(2, 4):
        validate(loss, e, epochs[e])
        validate(resumed, e, epochs[e])
    assert torch.equal(resumed.gamma, loss.gamma) and torch.equal(resumed.edges, loss.edges)


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_bins": 0}, "num_bins.*0"),
        ({"num_bins": 2.5}, "num_bins.*2.5"),
        ({"lambd": -1.0}, "lambd.*-1.0"),
        ({"gamma_min": 25.0}, "gamma_max.*20.0"),
        ({"gamma_init": 25.0}, "gamma_init.*25.0"),
        ({"gamma_init": -3.0}, "gamma_init.*-3.0"),
        ({"switch": -0.1}, "switch.*-0.1"),
        ({"switch": float("nan")}, "switch.*nan"),
        ({"sample_voxels": 10}, "sample_voxels.*10"),
        ({"seed": -1}, "seed.*-1"),
        ({"reduction": "none"}, "reduction.*none"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaFocalLoss(**kwargs)

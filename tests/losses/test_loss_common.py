"""Properties every loss must have: layouts, ignore_index, mixed precision, gradients, input checks, configs."""

from __future__ import annotations

import inspect
import pathlib

import hydra
import pytest
import torch
from omegaconf import OmegaConf

from .loss_zoo import (BASES, CONFIG_CLASSES, MULTILABEL_CASES, NUM_CLASSES, PRESETS, SOFTMAX_CASES, load_loss_config,
                       loss_classes, random_inputs)
from mcseg import losses as L

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPES = {"2d": (2, NUM_CLASSES, 5, 6), "3d": (2, NUM_CLASSES, 4, 3, 5)}
IGNORE = 255


def with_ignored(target, seed=1, fraction=0.3):
    g = torch.Generator().manual_seed(seed)
    target = target.clone()
    target[torch.rand(target.shape, generator=g) < fraction] = IGNORE
    return target


# ------------------------------------------------------------------ layouts and values
@pytest.mark.parametrize("name", SOFTMAX_CASES)
@pytest.mark.parametrize("dims", SHAPES)
def test_2d_3d_scalar_float32_finite_gradients(name, dims):
    loss = SOFTMAX_CASES[name].make()
    logits, target = random_inputs(SHAPES[dims])
    logits.requires_grad_(True)
    value = loss(logits, target)
    assert value.shape == () and value.dtype == torch.float32 and torch.isfinite(value)
    value.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("name", SOFTMAX_CASES)
def test_channel_first_target_accepted(name):
    loss = SOFTMAX_CASES[name].make()
    logits, target = random_inputs(SHAPES["2d"])
    assert torch.equal(loss(logits, target), loss(logits, target.unsqueeze(1)))


# ------------------------------------------------------------------ ignore_index
@pytest.mark.parametrize("name", SOFTMAX_CASES)
@pytest.mark.parametrize("dims", SHAPES)
def test_ignored_voxels_change_nothing(name, dims):
    loss = SOFTMAX_CASES[name].make(ignore_index=IGNORE)
    logits, target = random_inputs(SHAPES[dims])
    target = with_ignored(target)
    ignored = target == IGNORE
    assert ignored.any() and (~ignored).any()
    logits.requires_grad_(True)
    value = loss(logits, target)
    value.backward()
    # no gradient reaches an ignored voxel, and their logits can be anything
    assert torch.all(logits.grad.movedim(1, -1)[ignored] == 0)
    other = logits.detach().clone()
    other.movedim(1, -1)[ignored] = torch.randn(int(ignored.sum()), NUM_CLASSES) * 50
    assert torch.allclose(loss(other, target), value, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", [n for n, c in SOFTMAX_CASES.items() if not c.spatial])
def test_ignored_voxels_equal_dropping_them(name):
    """With B = 1 every non-spatial loss over the kept voxels equals the loss on them alone."""
    loss = SOFTMAX_CASES[name].make(ignore_index=IGNORE)
    logits, target = random_inputs((1, NUM_CLASSES, 6, 7))
    target = with_ignored(target)
    keep = target != IGNORE
    kept_logits = logits.movedim(1, -1)[keep].T.unsqueeze(0)  # 1 x C x N (one spatial dim)
    kept_target = target[keep].unsqueeze(0)
    plain = SOFTMAX_CASES[name].make()
    assert loss(logits, target).item() == pytest.approx(plain(kept_logits, kept_target).item(), rel=1e-6)


@pytest.mark.parametrize("name", SOFTMAX_CASES)
def test_ignore_index_without_ignored_voxels_is_a_no_op(name):
    logits, target = random_inputs(SHAPES["3d"])
    a = SOFTMAX_CASES[name].make(ignore_index=IGNORE)(logits, target)
    b = SOFTMAX_CASES[name].make()(logits, target)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)


@pytest.mark.parametrize("name", SOFTMAX_CASES)
def test_all_voxels_ignored_gives_zero_not_nan(name):
    loss = SOFTMAX_CASES[name].make(ignore_index=-1)
    logits, _ = random_inputs(SHAPES["2d"])
    value = loss(logits, torch.full((2, 5, 6), -1))
    assert torch.isfinite(value)
    if SOFTMAX_CASES[name].per_voxel or SOFTMAX_CASES[name].spatial:
        assert value.item() == 0.0


# ------------------------------------------------------------------ mixed precision
@pytest.mark.parametrize("name", [*SOFTMAX_CASES, *MULTILABEL_CASES])
def test_bf16_autocast_gives_float32_value(name):
    case = {**SOFTMAX_CASES, **MULTILABEL_CASES}[name]
    loss = case.make()
    logits, target = random_inputs(SHAPES["2d"])
    if case.cls.multilabel:
        target = (torch.rand(logits.shape, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    reference = loss(logits, target)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = loss(logits, target)
        probs = loss.probabilities(logits)
    assert under_autocast.dtype == torch.float32 and probs.dtype == torch.float32
    assert under_autocast.item() == pytest.approx(reference.item(), rel=1e-6)
    # bf16 logits (as a network under autocast returns them) are computed in float32
    half = logits.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(half, target)
    assert value.dtype == torch.float32
    assert value.item() == pytest.approx(loss(half.float(), target).item(), rel=1e-6)


# ------------------------------------------------------------------ gradients
# the self-adaptive FCL weight and ACLS's max logit in its negative term are detached on purpose: their
# gradients are checked in test_loss_focal and test_loss_acls
@pytest.mark.parametrize("name", [n for n in SOFTMAX_CASES if n not in ("fcl_adaptive", "acls")])
@pytest.mark.parametrize("dims", ["2d", "3d"])
def test_gradcheck_float64(name, dims):
    shape = {"2d": (2, NUM_CLASSES, 3, 4), "3d": (1, NUM_CLASSES, 3, 2, 3)}[dims]
    loss = SOFTMAX_CASES[name].make(ignore_index=IGNORE)
    logits, target = random_inputs(shape, seed=7, dtype=torch.float64, scale=2.0)
    target.view(-1)[1] = IGNORE
    logits.requires_grad_(True)
    assert loss(logits, target).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda z: loss(z, target), (logits,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", MULTILABEL_CASES)
def test_gradcheck_float64_multilabel(name):
    loss = MULTILABEL_CASES[name].make()
    logits, _ = random_inputs((2, 3, 3, 4), seed=7, dtype=torch.float64, scale=2.0)
    target = (torch.rand(logits.shape, generator=torch.Generator().manual_seed(1)) > 0.5).double()
    mask = torch.rand(2, 1, 3, 4, generator=torch.Generator().manual_seed(0)) > 0.3
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: loss(z, target, mask), (logits,), eps=1e-6, atol=1e-6)


# ------------------------------------------------------------------ reductions
@pytest.mark.parametrize("name", [n for n, c in SOFTMAX_CASES.items() if "sum" in c.cls.reductions])
def test_sum_is_mean_times_kept_voxels(name):
    logits, target = random_inputs(SHAPES["2d"])
    target = with_ignored(target)
    mean = SOFTMAX_CASES[name].make(ignore_index=IGNORE)(logits, target)
    total = SOFTMAX_CASES[name].make(ignore_index=IGNORE, reduction="sum")(logits, target)
    assert total.item() == pytest.approx(mean.item() * int((target != IGNORE).sum()), rel=1e-6)


# ------------------------------------------------------------------ input checks
@pytest.mark.parametrize("name", SOFTMAX_CASES)
def test_input_checks(name):
    loss = SOFTMAX_CASES[name].make(ignore_index=IGNORE)
    logits, target = random_inputs(SHAPES["2d"])
    bad = target.clone()
    bad[0, 0, 0] = NUM_CLASSES + 1
    with pytest.raises(ValueError, match=rf"maximum label {NUM_CLASSES + 1}.*C={NUM_CLASSES}"):
        loss(logits, bad)
    bad[0, 0, 0] = -3
    with pytest.raises(ValueError, match="-3"):
        loss(logits, bad)
    with pytest.raises(ValueError, match="target shape"):
        loss(logits, target[:, :-1])
    with pytest.raises(ValueError, match="integer"):
        loss(logits, target.float() + 0.5)
    assert loss(logits, target.float()).item() == pytest.approx(loss(logits, target).item())
    with pytest.raises(TypeError, match="floating"):
        loss(target.unsqueeze(1).expand(-1, NUM_CLASSES, -1, -1), target)
    with pytest.raises(ValueError, match="spatial"):
        loss(logits[0], target[0])
    with pytest.raises(ValueError, match="reduction"):
        SOFTMAX_CASES[name].make(reduction="none")
    with pytest.raises(ValueError, match="ignore_index"):
        SOFTMAX_CASES[name].make(ignore_index="255")


def test_label_equal_to_ignore_index_may_exceed_classes_but_others_may_not():
    loss = L.CELoss(ignore_index=IGNORE)
    logits, target = random_inputs(SHAPES["2d"])
    target[0, 0, 0] = IGNORE
    assert torch.isfinite(loss(logits, target))
    with pytest.raises(ValueError, match="maximum label 255"):
        L.CELoss()(logits, target)


def test_single_class_rejected():
    logits, target = random_inputs((1, 1, 3, 3), num_classes=1)
    with pytest.raises(ValueError, match="C=1"):
        L.CELoss()(logits, target)


# ------------------------------------------------------------------ API
@pytest.mark.parametrize("name", [*SOFTMAX_CASES, *MULTILABEL_CASES])
def test_probabilities(name):
    case = {**SOFTMAX_CASES, **MULTILABEL_CASES}[name]
    loss = case.make()
    logits, _ = random_inputs(SHAPES["3d"], dtype=torch.bfloat16)
    probs = loss.probabilities(logits)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    if not case.cls.multilabel:
        assert loss.multilabel is False
        assert torch.allclose(probs, torch.softmax(logits.float(), 1))
    else:
        assert loss.multilabel is True
        assert ((probs >= 0) & (probs <= 1)).all()


@pytest.mark.parametrize("name", SOFTMAX_CASES)
def test_state_dict_round_trip(name):
    loss = SOFTMAX_CASES[name].make()
    clone = SOFTMAX_CASES[name].make()
    clone.load_state_dict(loss.state_dict())
    logits, target = random_inputs(SHAPES["2d"])
    assert torch.equal(loss(logits, target), clone(logits, target))


def test_every_loss_class_has_a_config_and_every_config_a_loss():
    """Both sides discovered: the loss classes of mcseg/losses' modules, the _target_ of every configs/loss YAML."""
    classes = loss_classes()
    assert classes == set(CONFIG_CLASSES.values())
    exported = {obj for obj in vars(L).values() if inspect.isclass(obj) and issubclass(obj, torch.nn.Module)}
    assert exported - {L.SoftDice, *BASES} <= classes  # what the package exports is a loss with a config


@pytest.mark.parametrize("name", CONFIG_CLASSES)
def test_config_instantiates_at_the_class_defaults(name):
    """...or, for a preset (tests/losses/loss_zoo.py PRESETS), at the class defaults but for its stated values."""
    cfg = load_loss_config(name)
    tree = OmegaConf.create({"dataset": {"num_classes": 4, "sampling": {"dims": 2, "slice_axis": 0}}, "loss": cfg})
    loss = hydra.utils.instantiate(tree.loss)
    assert type(loss) is CONFIG_CLASSES[name]
    params = inspect.signature(CONFIG_CLASSES[name]).parameters
    keys = set(cfg) - {"_target_"}
    # every constructor argument except reduction is spelled out, at the class default (or read from the dataset)
    assert keys == set(params) - {"reduction"}
    from_dataset = {key for key in keys if OmegaConf.is_interpolation(cfg, key)}
    expected = {key: params[key].default for key in keys - from_dataset} | PRESETS.get(name, {})
    for key in keys - from_dataset:
        assert cfg[key] == expected[key], key
    if name in ("cals", "crac"):
        assert loss.num_classes == 4
    if name == "crac":
        assert (loss.dims, loss.slice_axis) == (2, 0)


def test_margin_config_keys():
    cfg = OmegaConf.load(ROOT / "configs" / "loss" / "margin.yaml")
    assert cfg.margin == 10.0 and cfg.alpha == 0.1
    loss = hydra.utils.instantiate(OmegaConf.merge(cfg, OmegaConf.from_dotlist(["margin=5", "alpha=0.2"])))
    assert loss.margin == 5.0 and loss.alpha == 0.2


def test_docs_table_lists_every_config():
    text = (ROOT / "docs" / "losses.md").read_text()
    for name in CONFIG_CLASSES:
        assert f"loss={name}" in text, name
        assert CONFIG_CLASSES[name].__name__ in text, name


# ------------------------------------------------------------------ a few optimisation steps
@pytest.mark.parametrize("name", [*SOFTMAX_CASES, *MULTILABEL_CASES])
def test_adam_steps_reduce_the_loss(name):
    case = {**SOFTMAX_CASES, **MULTILABEL_CASES}[name]
    torch.manual_seed(0)
    loss = case.make()
    image = torch.randn(2, 1, 8, 8)
    target = (image[:, 0] > 0).long() + (image[:, 0] > 1).long()  # 3 classes from intensity
    if case.cls.multilabel:
        target = torch.stack([target >= 1, target >= 2, target >= 0], dim=1).float()
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, NUM_CLASSES, 1)
    )
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    first = loss(net(image), target).item()
    for _ in range(15):
        opt.zero_grad()
        loss(net(image), target).backward()
        opt.step()
    assert loss(net(image), target).item() < first

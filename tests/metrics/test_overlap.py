"""Dice per class and case, with the empty-structure policy."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcseg.metrics.empty import StructureStatus
from mcseg.metrics.overlap import DiceMetric, dice, overlap_counts

from .reference import blobs


def test_dice_by_hand_with_every_status():
    # K = 5. class 1: label 3 voxels, prediction 2 of them + 1 more -> 2*2/(3+3);
    # class 2 missed, class 3 false alarm, class 4 absent from both
    label = torch.tensor([1, 1, 1, 2, 0, 0])
    pred = torch.tensor([1, 1, 0, 0, 1, 3])
    d = dice(pred, label, num_classes=5)
    assert d[1].item() == pytest.approx(4 / 6)
    assert d[2].item() == 0.0 and d[3].item() == 0.0
    assert math.isnan(d[4].item())
    assert d[0].item() == 0.0  # background: label at {4, 5}, prediction at {2, 3}
    status = overlap_counts(pred, label, 5).status()
    assert status[1:] == [StructureStatus.OK, StructureStatus.MISSED, StructureStatus.FALSE_ALARM,
                          StructureStatus.BOTH_EMPTY]


def test_multilabel_regions_overlap():
    label = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    pred = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    d = dice(pred, label, num_classes=2, multilabel=True)
    assert d[0].item() == pytest.approx(0.5) and math.isnan(d[1].item())


def test_values_outside_the_classes_are_refused():
    with pytest.raises(ValueError, match=r"label values must lie in \[0, 3\)"):
        dice(torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 3, 0]), 3)


def test_agrees_with_monai_dice():
    from monai.metrics import DiceMetric as MonaiDice

    label, pred = blobs((24, 20, 16), 4, seed=0), blobs((24, 20, 16), 4, seed=1)
    ours = dice(pred, label, 4)
    onehot = lambda t: torch.nn.functional.one_hot(t, 4).movedim(-1, 0)[None].float()  # noqa: E731
    theirs = MonaiDice(include_background=True, reduction="none")(onehot(pred), onehot(label))[0]
    torch.testing.assert_close(ours, theirs.double(), atol=1e-6, rtol=0)


def test_metric_class_aggregates_with_nan_excluded_and_counts():
    metric = DiceMetric(num_classes=3)
    metric(torch.tensor([1, 1, 0]), torch.tensor([1, 0, 0]))  # class 1: 2/3; class 2 both empty
    metric(torch.tensor([0, 2, 0]), torch.tensor([1, 2, 0]))  # class 1 missed: 0; class 2: 2/2
    out = metric.aggregate()
    assert out["mean"][1].item() == pytest.approx(1 / 3)
    assert out["mean"][2].item() == pytest.approx(1.0) and out["n_defined"][2].item() == 1
    assert out["status_counts"]["both_empty"][2] == 1 and out["status_counts"]["missed"][1] == 1


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 5), n=st.integers(1, 200))
def test_property_dice_is_symmetric_and_bounded(seed, k, n):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, k, (n,), generator=g), torch.randint(0, k, (n,), generator=g)
    dab, dba = dice(a, b, k), dice(b, a, k)
    torch.testing.assert_close(dab, dba, equal_nan=True)
    defined = dab[~dab.isnan()]
    assert bool(((defined >= 0) & (defined <= 1)).all())
    daa = dice(a, a, k)
    assert bool((daa[~daa.isnan()] == 1).all())

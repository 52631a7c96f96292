"""Voxel regions for calibration, named and hand-checked."""
from __future__ import annotations

import pytest
import torch

from mcseg.metrics.regions import REGIONS, boundary_band, region_mask


def test_foreground_regions_by_hand():
    label = torch.tensor([0, 1, 1, 0, 2, 0])
    pred = torch.tensor([0, 1, 0, 2, 2, 0])
    assert region_mask("label_foreground", label, pred).tolist() == [False, True, True, False, True, False]
    assert region_mask("union_foreground", label, pred).tolist() == [False, True, True, True, True, False]
    assert region_mask("all", label, pred) is None
    with pytest.raises(ValueError, match="region must be one of"):
        region_mask("foreground", label, pred)
    assert set(REGIONS) == {"label_foreground", "union_foreground", "all", "boundary"}


def test_boundary_band_width_in_mm_with_anisotropic_spacing():
    # 1 x 12 row: labels 0 for x < 6, 1 for x >= 6; the interface voxels are x = 5 and x = 6
    label = torch.zeros(3, 12, dtype=torch.long)
    label[:, 6:] = 1
    # spacing 0.5 mm along x: width 1 mm reaches 2 voxels on each side of the interface voxels
    band = boundary_band(label, spacing=(1.0, 0.5), width_mm=1.0)
    assert band[1].nonzero()[:, 0].tolist() == [3, 4, 5, 6, 7, 8]
    assert band.all(0).tolist() == band[1].tolist()  # the image border is not a label boundary
    # width 0: the interface voxels only; spacing 2 mm and width 1.9 mm: still only them
    assert boundary_band(label, (1.0, 1.0), 0.0)[0].nonzero()[:, 0].tolist() == [5, 6]
    assert boundary_band(label, (1.0, 2.0), 1.9)[0].nonzero()[:, 0].tolist() == [5, 6]


def test_boundary_band_is_euclidean_in_3d():
    label = torch.zeros(9, 9, 9, dtype=torch.long)
    label[4, 4, 4] = 1  # one voxel: boundary = it and its 6 face neighbours
    band = region_mask("boundary", label, label, spacing=(1.0, 1.0, 1.0), boundary_width_mm=1.0)
    # distance <= 1 from the 7-voxel cross: the 3x3x3 block minus its 8 corners (sqrt(2) from the cross
    # for edges: included? edge voxel (5,5,4) is at distance 1 from (5,4,4) -> yes; corner (5,5,5) is at
    # sqrt(2) from the nearest cross voxel -> no) plus the 6 voxels two steps out along the axes
    expected = 27 - 8 + 6
    assert band.sum().item() == expected and not band[5, 5, 5] and band[6, 4, 4]


def test_uniform_label_has_an_empty_band():
    label = torch.ones(5, 5, dtype=torch.long)
    assert region_mask("boundary", label, label, (1.0, 1.0), 3.0).sum().item() == 0
    with pytest.raises(ValueError, match="spacing"):
        region_mask("boundary", label, label)

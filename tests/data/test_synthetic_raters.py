"""The synthetic raters of the simulated multi-rater study (scripts/synthetic_raters.py, issue #37): each
perturbation is what its docstring says (erosion and dilation by one voxel, displacements bounded by their size
and seeded), and the folder they make is read by the MSD loader as five named raters per case."""
from __future__ import annotations

import sys

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from mcseg.data.raters import majority_vote
from tests import fake_datasets as fd

from ..conftest import ROOT
from .data_helpers import build

sys.path.insert(0, str(ROOT / "scripts"))
import synthetic_raters as sr  # noqa: E402


def _blob() -> np.ndarray:
    label = np.zeros((20, 22, 18), np.uint8)
    z, y, x = np.indices(label.shape)
    inside = (z - 10) ** 2 / 36 + (y - 11) ** 2 / 49 + (x - 9) ** 2 / 25 <= 1
    label[inside] = np.where(y[inside] < 11, 1, 2)  # two touching classes, as the hippocampus' two parts
    return label


def _inside_neighbours(inside: np.ndarray) -> np.ndarray:
    """Per voxel, how many of its six face neighbours are inside (outside the volume counts as outside)."""
    padded = np.pad(inside, 1, constant_values=False).astype(np.int64)
    core = tuple(slice(1, -1) for _ in range(inside.ndim))
    count = np.zeros(inside.shape, np.int64)
    for axis in range(inside.ndim):
        for step in (-1, 1):
            count += np.roll(padded, step, axis)[core]
    return count


@pytest.mark.parametrize("touching_the_edge", [False, True])
def test_erosion_and_dilation_move_the_boundary_by_one_voxel(touching_the_edge):
    label = _blob()
    if touching_the_edge:  # the volume's edge is background for the erosion: voxels on it go
        label = label[6:]
        assert (label[0] > 0).any()
    eroded, dilated = sr.eroded(label), sr.dilated(label)
    inside = label > 0
    neighbours = _inside_neighbours(inside)
    # eroded: exactly the voxels of the union whose six neighbours are all inside; classes kept
    np.testing.assert_array_equal(eroded > 0, inside & (neighbours == 6))
    assert np.all(eroded[eroded > 0] == label[eroded > 0])
    assert 0 < (eroded > 0).sum() < inside.sum()
    # dilated: the union grown by one voxel; old voxels keep their class, new ones take a neighbour's class
    np.testing.assert_array_equal(dilated > 0, inside | (neighbours > 0))
    assert np.all(dilated[inside] == label[inside])
    for c in (1, 2):
        new = (dilated == c) & ~inside
        assert new.any() and np.all(ndimage.binary_dilation(label == c, sr.SIX_NEIGHBOURS)[new])
    assert np.array_equal(sr.dilated(np.zeros_like(label)), np.zeros_like(label))


def test_displacements_are_bounded_smooth_and_seeded():
    label = _blob()
    spacing = np.array([1.0, 1.0, 2.0])
    field = sr.displacement_field(label.shape, spacing, 1.0, 4.0, seed=7)
    length_mm = np.sqrt(((field * spacing[:, None, None, None]) ** 2).sum(0))
    assert np.sqrt((length_mm ** 2).mean()) == pytest.approx(1.0) and length_mm.max() < 4.0
    assert np.abs(np.diff(field, axis=1)).max() < 0.5  # smooth: neighbours move nearly together
    np.testing.assert_array_equal(field, sr.displacement_field(label.shape, spacing, 1.0, 4.0, seed=7))
    assert not np.array_equal(field, sr.displacement_field(label.shape, spacing, 1.0, 4.0, seed=8))
    moved = sr.shifted(label, field)
    assert 0 < (moved != label).sum() < 0.5 * (label > 0).sum()
    # every voxel takes a class found within the displacement of it (rounded to whole voxels)
    reach = int(np.ceil(np.abs(field).max() + 0.5))
    for c in (0, 1, 2):
        near = ndimage.binary_dilation(label == c, np.ones((2 * reach + 1,) * 3, bool))
        assert np.all(near[moved == c])
    np.testing.assert_array_equal(sr.shifted(label, np.zeros_like(field)), label)


def test_the_folder_is_read_as_five_named_raters(make_cfg, tmp_path):
    source = fd.write_msd(tmp_path / "msd", n_cases=3, shape=(20, 22, 12))
    result = sr.build(source, tmp_path / "raters", rms_mm=1.0, smoothness_mm=4.0, seed=0)
    assert result["cases"] == 3 and 0 < result["mean_disagreement_of_foreground"] < 1
    dataset = build(make_cfg, ["dataset=msd", f"dataset.root={tmp_path / 'raters'}", "dataset.preprocess.workers=1",
                               "dataset.split.val_fraction=0.34", "dataset.split.test_fraction=0.34"])[0]
    refs = dataset.case_refs()
    assert [r.case_id for r in refs] == ["case_000", "case_001", "case_002"]
    assert all(r.rater_names == sr.RATERS for r in refs)
    raw = dataset.read(refs[0])
    original = np.asarray(nib.load(source / "labelsTr" / "case_000.nii.gz").dataobj)
    np.testing.assert_array_equal(raw.raters[0], original)  # "original" is the data set's own label
    np.testing.assert_array_equal(raw.raters[1], sr.eroded(original))
    np.testing.assert_array_equal(raw.label, majority_vote(raw.raters, 3))
    again = sr.build(source, tmp_path / "again", rms_mm=1.0, smoothness_mm=4.0, seed=0)
    assert again == result  # the same raters on every machine
    for rater in sr.RATERS:
        a = nib.load(tmp_path / "raters" / f"labelsTr_{rater}" / "case_001.nii.gz")
        b = nib.load(tmp_path / "again" / f"labelsTr_{rater}" / "case_001.nii.gz")
        np.testing.assert_array_equal(np.asarray(a.dataobj), np.asarray(b.dataobj))
        np.testing.assert_allclose(a.affine, b.affine)

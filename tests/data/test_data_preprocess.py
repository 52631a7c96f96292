"""Preprocessing steps and their inverse: orientation, non-zero crop, resampling, centre crop/pad, normalisation."""
from __future__ import annotations

import itertools

import nibabel.orientations as nio
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcseg.data.normalize import check_normalization, normalize_image
from mcseg.data.preprocess import PreprocessConfig, forward, invert, preprocess_config, reorient_tensor
from mcseg.errors import ConfigError

ORNTS = [np.array([[p[i], f[i]] for i in range(3)], dtype=float)
         for p in itertools.permutations(range(3)) for f in itertools.product((1, -1), repeat=3)]


@pytest.mark.parametrize("k", range(len(ORNTS)))
def test_reorient_tensor_is_nibabels_apply_orientation(k):
    arr = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    ornt = ORNTS[k]
    expected = np.moveaxis(nio.apply_orientation(np.moveaxis(arr, 0, -1), ornt), -1, 0)
    np.testing.assert_array_equal(reorient_tensor(torch.from_numpy(arr), ornt).numpy(), expected)


def random_affine(rng, spacing):
    """A random oblique voxel-to-world affine with the given spacing."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    affine = np.eye(4)
    affine[:3, :3] = q * np.asarray(spacing)[None]
    affine[:3, 3] = rng.uniform(-100, 100, 3)
    return affine


def blob_case(rng, shape, channels=2, margin=2):
    """Non-zero image inside a box (zero around it, as skull-stripped MRI) and a label inside it."""
    image = np.zeros((channels, *shape), np.float32)
    lo = [int(rng.integers(0, margin + 1)) for _ in shape]
    hi = [n - int(rng.integers(0, margin + 1)) for n in shape]
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    image[(slice(None),) + box] = rng.uniform(1, 2, (channels,) + tuple(b - a for a, b in zip(lo, hi)))
    label = np.zeros(shape, np.int64)
    label[box] = rng.integers(0, 4, tuple(b - a for a, b in zip(lo, hi)))
    return image, label


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), orientation=st.sampled_from([None, "RAS", "LPS", "PIR"]),
       crop=st.booleans(), size=st.sampled_from([None, [6, None, 9], [12, 3, None]]))
def test_forward_then_invert_is_exact_without_resampling(seed, orientation, crop, size):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(4, 10, 3))
    image, label = blob_case(rng, shape)
    affine = random_affine(rng, rng.uniform(0.5, 3, 3))
    cfg = preprocess_config({"orientation": orientation, "crop_to_nonzero": crop, "crop_size": size}, 3)
    img, lab, geometry = forward(image, label, (1.0, 1.0, 1.0), affine, cfg, {"scheme": "none"})
    assert img.shape[1:] == lab.shape == geometry.shape
    probs = torch.nn.functional.one_hot(torch.from_numpy(lab), 4).movedim(-1, 0).float()
    back = invert(probs, geometry)
    assert tuple(back.shape[1:]) == shape
    kept = np.ones(shape, bool)
    if size is not None:  # a centre crop drops what lies outside it: those voxels come back as background
        kept = invert(torch.ones((1, *lab.shape)), geometry, multilabel=True)[0].numpy() > 0.5
    np.testing.assert_array_equal(back.argmax(0).numpy()[kept], label[kept])
    assert (back.argmax(0).numpy()[~kept] == 0).all()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), orientation=st.sampled_from([None, "RAS", "LAI"]),
       target=st.sampled_from([[1.0, 1.0, 1.0], [0.7, 1.3, None], [2.0, 0.5, 1.5]]))
def test_network_affine_points_at_the_same_anatomy(seed, orientation, target):
    """World coordinates are kept: the label of a network voxel is the file's label at the same world point."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(5, 12, 3))
    spacing = tuple(float(s) for s in rng.uniform(0.6, 2.5, 3))
    image, label = blob_case(rng, shape, margin=0)
    affine = random_affine(rng, spacing)
    cfg = preprocess_config({"orientation": orientation, "target_spacing": target, "crop_to_nonzero": True}, 3)
    _, lab, geometry = forward(image, label, spacing, affine, cfg, {"scheme": "none"})
    net = np.asarray(geometry.affine)
    to_file = np.linalg.inv(affine) @ net
    idx = np.stack(np.meshgrid(*[np.arange(n) for n in lab.shape], indexing="ij"), -1).reshape(-1, 3)
    file_idx = (to_file[:3, :3] @ idx.T).T + to_file[:3, 3]
    tie = np.abs(file_idx - np.floor(file_idx) - 0.5) < 1e-6  # half-way points may round either way
    ok = np.zeros(len(idx), bool)
    for combo in itertools.product((0.5, -0.5), repeat=3):
        shifted = np.where(tie, file_idx + np.asarray(combo), file_idx)
        nearest = np.clip(np.floor(shifted + 0.5).astype(int), 0, np.array(shape) - 1)
        ok |= label[tuple(nearest.T)] == lab.reshape(-1)
    assert ok.all()
    np.testing.assert_allclose(np.linalg.norm(net[:3, :3], axis=0), geometry.spacing, rtol=1e-6)


def test_resampling_sets_the_target_spacing_and_keeps_unset_axes():
    rng = np.random.default_rng(0)
    image, label = blob_case(rng, (20, 16, 5), margin=0)
    cfg = preprocess_config({"target_spacing": [1.25, 1.0, None]}, 3)
    img, lab, geometry = forward(image, label, (1.5, 0.5, 8.0), np.diag([1.5, 0.5, 8.0, 1.0]), cfg, None)
    assert geometry.resampled_shape == (24, 8, 5) == lab.shape
    assert geometry.spacing == pytest.approx((1.25, 1.0, 8.0))
    assert set(np.unique(lab)) <= set(np.unique(label))  # nearest-neighbour labels: no new values
    back = invert(torch.rand(3, *lab.shape).softmax(0), geometry)
    torch.testing.assert_close(back.sum(0), torch.ones(20, 16, 5))


def test_centre_crop_and_pad_use_background_outside_the_field_of_view():
    image = np.ones((1, 10, 10, 3), np.float32)
    label = np.ones((10, 10, 3), np.int64)
    cfg = preprocess_config({"crop_size": [6, 14, None]}, 3)
    img, lab, geometry = forward(image, label, (1, 1, 1), np.eye(4), cfg, {"scheme": "none"})
    assert img.shape == (1, 6, 14, 3) and geometry.pad_start == [2, -2, 0]
    assert lab[:, :2].sum() == 0 and lab[:, 2:12].all()  # padding is background
    back = invert(torch.nn.functional.one_hot(torch.from_numpy(lab), 2).movedim(-1, 0).float(), geometry)
    assert back[0, :2].eq(1).all() and back[1, 2:8].eq(1).all()  # cropped-away voxels come back as background
    ml = invert(torch.ones(2, *lab.shape), geometry, multilabel=True)
    assert ml[:, :2].eq(0).all()  # multi-label: 0 outside


@pytest.mark.parametrize("node,message", [
    ({"orientation": "RAX"}, "orientation"),
    ({"orientation": "RRS"}, "orientation"),
    ({"target_spacing": [1.0, 1.0]}, "target_spacing"),
    ({"target_spacing": [1.0, -1.0, 1.0]}, "target_spacing"),
    ({"crop_size": [0, 4, 4]}, "crop_size"),
    ({"image_order": 2}, "image_order"),
])
def test_bad_preprocess_settings_are_named(node, message):
    with pytest.raises(ValueError, match=f"dataset.preprocess.{message}"):
        preprocess_config(node, 3)


def test_unknown_preprocess_key_is_named():
    with pytest.raises(ConfigError, match="dataset.preprocess.target_spacin"):
        preprocess_config({"target_spacin": [1, 1, 1]}, 3)


def test_identity_settings_change_nothing():
    assert PreprocessConfig().identity
    assert preprocess_config({"target_spacing": [None, None, None], "crop_size": None}, 3).identity
    assert not preprocess_config({"orientation": "RAS"}, 3).identity


def test_normalisation_per_channel_and_inside_the_brain():
    rng = np.random.default_rng(1)
    image = np.zeros((2, 8, 8, 8), np.float32)
    image[:, 2:6, 2:6, 2:6] = rng.normal([[[[5.0]]], [[[200.0]]]], [[[[2.0]]], [[[30.0]]]], (2, 4, 4, 4))
    out = normalize_image(image, check_normalization({"scheme": "zscore", "nonzero": True}))
    inside = out[:, 2:6, 2:6, 2:6].reshape(2, -1)
    np.testing.assert_allclose(inside.mean(1), 0, atol=1e-5)
    np.testing.assert_allclose(inside.std(1), 1, atol=1e-5)
    assert (out[:, 0] == 0).all()
    spec = check_normalization([{"scheme": "zscore", "clip": [-1, 1]}, {"scheme": "none"}], in_channels=2)
    out = normalize_image(image, spec)
    np.testing.assert_array_equal(out[1], image[1])
    with pytest.raises(ValueError, match="lists 1 channels"):
        check_normalization([{"scheme": "zscore"}], in_channels=2)
    with pytest.raises(ValueError, match=r"dataset.normalization.schem"):
        check_normalization({"schem": "zscore"})

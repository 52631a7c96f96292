"""Training samples: MONAI augmentation stays a pure function of (seed, epoch, index); multi-label labels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mcseg.data.augment import augment_config
from mcseg.data.cases import CaseData, to_regions
from mcseg.data.sampling import PatchDataset
from mcseg.data.synthetic import phantom
from mcseg.errors import ConfigError

AUGMENT = {"rotate_deg": 30, "scale": [0.8, 1.25], "spatial_prob": 0.8, "gamma": [0.7, 1.5], "noise_std": 0.1,
           "intensity_prob": 0.5}


def cases(n=3, shape=(24, 28, 20), multilabel=False):
    out = []
    for i in range(n):
        image, label = phantom(shape, 0, i)
        lab = to_regions(label, [[1, 2, 3], [2, 3], [3]]) if multilabel else label
        out.append(CaseData(f"c{i}", image[None].astype(np.float32), lab, (1.0,) * 3, np.eye(4)))
    return out


def sample_stream(ds, indices):
    return [ds[i] for i in indices]


@pytest.mark.parametrize("dims,patch", [(2, (16, 16)), (3, (16, 16, 12))])
def test_augmented_samples_are_a_pure_function_of_seed_epoch_index(dims, patch):
    data = cases()
    a = PatchDataset(data, dims, patch, 8, foreground_ratio=0.5, flip_axes=[0], seed=3, augment=AUGMENT)
    b = PatchDataset(data, dims, patch, 8, foreground_ratio=0.5, flip_axes=[0], seed=3, augment=AUGMENT)
    order = [5, 0, 13, 9, 2]
    for x, y in zip(sample_stream(a, order), sample_stream(b, list(reversed(order)))[::-1]):
        torch.testing.assert_close(x["image"], y["image"], rtol=0, atol=0)
        torch.testing.assert_close(x["label"], y["label"], rtol=0, atol=0)
    other = PatchDataset(data, dims, patch, 8, foreground_ratio=0.5, flip_axes=[0], seed=4, augment=AUGMENT)
    assert any(not torch.equal(a[i]["image"], other[i]["image"]) for i in range(4))
    for i in range(8):
        s = a[i]
        assert s["image"].shape == (1, *patch) and s["label"].shape == patch
        assert set(s["label"].unique().tolist()) <= {0, 1, 2, 3}


def test_rotation_and_scaling_move_image_and_label_together():
    """The image is the label map itself: after warping, bilinear image and nearest label still agree."""
    image, label = phantom((40, 40), 0, 1)
    case = CaseData("c", label[None].astype(np.float32), label, (1.0, 1.0), np.eye(4))
    ds = PatchDataset([case], 2, (32, 32), 16, foreground_ratio=1.0, seed=0,
                      augment={"rotate_deg": 40, "scale": [0.7, 1.4], "spatial_prob": 1.0})
    warped = 0
    for i in range(16):
        s = ds[i]
        img, lab = s["image"][0], s["label"]
        assert (img.round() == lab).float().mean() > 0.9
        plain = torch.from_numpy(label[None].astype(np.float32))
        warped += int(not any(torch.equal(img, plain[0, x:x + 32, y:y + 32]) for x in range(9) for y in range(9)))
    assert warped >= 12  # spatial_prob=1: (almost) every sample is transformed


def test_multilabel_samples_keep_the_region_axis_and_centre_on_foreground():
    data = cases(multilabel=True)
    ds = PatchDataset(data, 3, (12, 12, 12), 10, foreground_ratio=1.0, flip_axes=[0, 2], seed=0, augment=AUGMENT)
    for i in range(10):
        s = ds[i]
        assert s["label"].shape == (3, 12, 12, 12)
        assert set(s["label"].unique().tolist()) <= {0, 1}
        assert s["label"][0].any()  # centred on a region voxel
    slices = PatchDataset(data, 2, (16, 16), 6, foreground_ratio=1.0, seed=0)
    assert slices[0]["label"].shape == (3, 16, 16)


def test_cached_foreground_points_are_used(monkeypatch):
    data = cases(n=1)
    data[0].meta["fg_points"] = {3: np.array([[5, 6, 7]])}
    ds = PatchDataset(data, 3, (4, 4, 4), 5, foreground_ratio=1.0, seed=0)
    for i in range(5):
        s = ds[i]
        centre = s["label"][2, 2, 2].item()
        assert centre == data[0].label[5, 6, 7]


@pytest.mark.parametrize("node,key", [
    ({"rotate_deg": -1}, "rotate_deg"),
    ({"scale": [1.2, 0.8]}, "scale"),
    ({"gamma": [0.5]}, "gamma"),
    ({"spatial_prob": 2}, "spatial_prob"),
    ({"rotate_axes": [3]}, "rotate_axes"),
    ({"noise_std": -0.1}, "noise_std"),
])
def test_bad_augmentation_is_named(node, key):
    with pytest.raises(ValueError, match=f"dataset.augment.{key}"):
        augment_config(node)


def test_unknown_augmentation_key_and_all_off():
    with pytest.raises(ConfigError, match="dataset.augment.rotation"):
        augment_config({"rotation": 10})
    assert augment_config({"rotate_deg": 0.0, "scale": None}) is None


def test_labels_travel_compact_and_reach_the_device_as_int64():
    from mcseg.training.loader import to_device

    data = [CaseData(c.case_id, c.image, c.label.astype(np.uint8), c.spacing, c.affine)
            for c in cases(2)]  # uint8 labels, as the preprocessing cache keeps them
    ds = PatchDataset(data, 3, (12, 12, 12), 4, foreground_ratio=1.0, seed=0)
    sample = ds[0]
    assert sample["label"].dtype == torch.uint8  # an eighth of int64's bytes through shared and pinned memory
    batch = {"image": sample["image"][None], "label": sample["label"][None]}
    _, label = to_device(batch, torch.device("cpu"))
    assert label.dtype == torch.int64 and torch.equal(label, sample["label"][None].long())
    read = [CaseData("w", c.image, c.label.astype(np.int64), c.spacing, c.affine) for c in data]  # read from files
    assert PatchDataset(read, 3, (12, 12, 12), 2, seed=0)[0]["label"].dtype == torch.uint8  # values 0..3 fit
    read[1].label[0, 0, 0] = 300  # a value that uint8 cannot hold: every sample of the run travels as int64
    assert PatchDataset(read, 3, (12, 12, 12), 2, seed=0)[0]["label"].dtype == torch.int64
    read[1].label[0, 0, 0] = -1
    assert PatchDataset(read, 3, (12, 12, 12), 2, seed=0)[0]["label"].dtype == torch.int64

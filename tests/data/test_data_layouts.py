"""Every dataset read straight from its download layout, and mapped back to the original geometry exactly."""
from __future__ import annotations

import json
import math

import nibabel as nib
import numpy as np
import pytest
import torch
from .data_helpers import ALL_DOWNLOADS, build, dice_and_hd95, fake_download, perfect_probabilities

from mcseg.data.cases import apply_label_mapping
from mcseg.data.io import VolumeError

EXPECTED = {  # name: (cases, num_classes, in_channels, multilabel, first case id)
    "acdc": (28, 4, 1, False, "patient001_ED"),
    "flare": (6, 5, 1, False, "train_001"),
    "brats": (6, 4, 4, False, "BraTS20_Training_001"),
    "brats_regions": (6, 3, 4, True, "BraTS2021_00000"),
    "brats2019": (9, 4, 4, False, "BraTS19_TCIA00_100_1"),
    "prostate": (6, 3, 2, False, "prostate_000"),
    "mrbrains": (5, 4, 3, False, "1"),
    "mrbrains2018": (5, 4, 3, False, "1"),
    "nnunet": (6, 4, 2, False, "fake_000"),
    "nnunet_regions": (6, 3, 2, True, "fake_000"),
}


def original_label(dataset, ref) -> np.ndarray:
    """The label read with nibabel alone, mapped by the dataset's convention (regions if multi-label)."""
    raw = np.asarray(nib.load(str(ref.label_path)).dataobj).astype(np.int64)
    label = apply_label_mapping(raw, dataset.label_mapping)
    if dataset.multilabel:
        return np.stack([np.isin(label, v) for v in dataset.regions.values()]).astype(np.uint8)
    return label


@pytest.mark.parametrize("name", ALL_DOWNLOADS)
def test_download_layout_is_read_as_published(make_cfg, tmp_path, name):
    root, overrides = fake_download(name, tmp_path)
    dataset, _ = build(make_cfg, overrides)
    n_cases, num_classes, channels, multilabel, first = EXPECTED[name]
    refs = dataset.case_refs()
    assert len(refs) == n_cases
    assert refs[0].case_id == first
    assert (dataset.num_classes, dataset.in_channels, dataset.multilabel) == (num_classes, channels, multilabel)
    assert len(dataset.class_names) == num_classes
    case = dataset.load(refs[0])
    assert case.image.dtype == np.float32 and case.image.shape[0] == channels and np.isfinite(case.image).all()
    spatial = case.image.shape[1:]
    if multilabel:
        assert case.label.shape == (num_classes, *spatial) and set(np.unique(case.label)) <= {0, 1}
        assert case.label.any()
    else:
        assert case.label.shape == spatial
        assert 0 < case.label.max() < num_classes and case.label.min() == 0
    assert case.meta["geometry"].shape == spatial


@pytest.mark.parametrize("name", ALL_DOWNLOADS)
def test_a_perfect_prediction_scores_dice_1_and_hd95_0_in_the_original_space(make_cfg, tmp_path, name):
    """Orientation, non-zero crop and centre crop/pad are undone exactly (resampling switched off here)."""
    root, overrides = fake_download(name, tmp_path)
    dataset, _ = build(make_cfg, overrides + ["dataset.preprocess.target_spacing=null"])
    for ref in dataset.case_refs()[:2]:
        case = dataset.load(ref)
        probs = perfect_probabilities(case.label, dataset.num_classes, dataset.multilabel)
        restored, label, spacing, affine = dataset.restore(case, probs)
        img = nib.load(str(ref.image_paths[0]))
        np.testing.assert_allclose(affine, img.affine, atol=1e-6)
        assert spacing == pytest.approx(img.header.get_zooms()[:3])
        expected = original_label(dataset, ref)
        np.testing.assert_array_equal(label, expected)
        assert tuple(restored.shape[1:]) == img.shape[:3]
        pred = (restored > 0.5).numpy() if dataset.multilabel else restored.argmax(0).numpy()
        np.testing.assert_array_equal(pred, expected)
        dice, hd = dice_and_hd95(restored, label, spacing, dataset.num_classes, dataset.multilabel)
        present = [k for k in range(len(dice)) if not math.isnan(dice[k])]
        assert present and np.all(dice[present] == 1.0) and np.all(hd[present] == 0.0)


@pytest.mark.parametrize("name", ["acdc", "flare", "prostate"])
def test_resampled_presets_map_back_within_a_voxel(make_cfg, tmp_path, name):
    """With the preset's resampling (lossy by nature) a perfect prediction stays within a voxel."""
    root, overrides = fake_download(name, tmp_path)
    dataset, _ = build(make_cfg, overrides)
    assert dataset.preprocess.target_spacing is not None
    cases = [dataset.load(ref) for ref in dataset.case_refs()[:4]]
    case = max(cases, key=lambda c: np.bincount(np.asarray(c.label).ravel()).min())  # the fixtures' largest anatomy
    assert case.meta["geometry"].resampled_shape != case.meta["geometry"].original_shape
    restored, label, spacing, _ = dataset.restore(case, perfect_probabilities(case.label, dataset.num_classes, False))
    assert tuple(restored.shape[1:]) == label.shape
    torch.testing.assert_close(restored.sum(0), torch.ones(label.shape), rtol=0, atol=1e-5)
    assert np.mean(restored.argmax(0).numpy() == label) > 0.995
    dice, hd = dice_and_hd95(restored, label, spacing, dataset.num_classes, False)
    assert np.nanmin(dice) > 0.9
    assert np.nanmax(hd) <= max(spacing) + 1e-6


def test_acdc_cases_are_the_ed_and_es_frames_of_info_cfg(make_cfg, tmp_path):
    root, overrides = fake_download("acdc", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    by_id = {r.case_id: r for r in dataset.case_refs()}
    info = (root / "training/patient002/Info.cfg").read_text()
    es = int(info.split("ES:")[1].split()[0])
    assert by_id["patient002_ES"].image_paths[0].name == f"patient002_frame{es:02d}.nii.gz"
    assert by_id["patient002_ES"].label_path.name == f"patient002_frame{es:02d}_gt.nii.gz"
    assert by_id["patient002_ED"].label_path.name == "patient002_frame01_gt.nii.gz"
    assert not any("4d" in str(p) for r in by_id.values() for p in r.image_paths)
    case = dataset.load(by_id["patient002_ED"])
    assert case.image.shape == (1, 48, 48, 6)  # in-plane 1.25 mm, centre-cropped; slices kept
    assert case.spacing[2] == pytest.approx(10.0) and case.spacing[0] == pytest.approx(1.25, rel=0.03)
    info = dataset.split_info()
    assert sorted(info.test) == [f"patient{p}_{f}" for p in (101, 102, 103, 104) for f in ("ED", "ES")]
    assert info.groups["patient003_ES"] == info.groups["patient003_ED"] == "patient003"
    assert info.strata["patient001_ED"] == "NOR" and info.strata["patient002_ED"] == "MINF"


def test_acdc_frames_option_and_the_2017_release_without_test_labels(make_cfg, tmp_path):
    from tests import fake_datasets as fd

    db = fd.write_acdc(tmp_path / "old", n_train=5, n_test=2, test_labels=False)
    dataset, _ = build(make_cfg, ["dataset=acdc", f"dataset.root={db.parent}", "dataset.frames=[ES]"])
    refs = dataset.case_refs()  # the root above database/ is accepted too
    assert [r.case_id for r in refs] == [f"patient00{i}_ES" for i in range(1, 6)]
    assert any("no _gt label files" in w for w in dataset.layout_warnings)
    assert dataset.split_info().test is None  # no official test set: the split fractions apply


def test_acdc_broken_info_cfg_is_named(make_cfg, tmp_path):
    root, overrides = fake_download("acdc", tmp_path)
    (root / "training/patient003/Info.cfg").write_text("Group: DCM\n")
    dataset, _ = build(make_cfg, overrides)
    with pytest.raises(ValueError, match=r"patient003/Info.cfg: no valid 'ED:'"):
        dataset.case_refs()


def test_brats_label_4_is_mapped_and_regions_follow_the_challenge(make_cfg, tmp_path):
    root, overrides = fake_download("brats", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    ref = dataset.case_refs()[0]
    raw = np.asarray(nib.load(str(ref.label_path)).dataobj)
    assert set(np.unique(raw)) == {0, 1, 2, 4}
    assert [p.name.rsplit("_", 1)[1] for p in ref.image_paths] == ["t1.nii.gz", "t1ce.nii.gz", "t2.nii.gz",
                                                                   "flair.nii.gz"]
    case = dataset.load(ref)
    assert set(np.unique(case.label)) == {0, 1, 2, 3}
    assert case.image.shape[1:] != nib.load(str(ref.image_paths[0])).shape  # cropped to the brain
    assert (case.image[:, case.label > 0] != 0).any()
    regions, _ = build(make_cfg, ["dataset=brats_regions"] + overrides[1:])
    assert regions.class_names == ["WT", "TC", "ET"] and regions.multilabel
    lab = regions.load(ref).label
    mapped = case.label
    np.testing.assert_array_equal(lab[0], np.isin(mapped, [1, 2, 3]))  # WT = {1, 2, 4}
    np.testing.assert_array_equal(lab[1], np.isin(mapped, [1, 3]))  # TC = {1, 4}
    np.testing.assert_array_equal(lab[2], mapped == 3)  # ET = {4}


def test_brats_2019_grades_stratify_and_odd_label_names_are_found(make_cfg, tmp_path):
    root, overrides = fake_download("brats2019", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    info = dataset.split_info()
    assert set(info.strata.values()) == {"HGG", "LGG"}
    # BraTS 2020 case 355 ships its label as W39_1998.09.19_Segm.nii
    folder = dataset.case_refs()[0].label_path.parent
    odd = folder / "W39_1998.09.19_Segm.nii"
    nib.save(nib.load(str(dataset.case_refs()[0].label_path)), str(odd))
    dataset.case_refs()[0].label_path.unlink()
    dataset, _ = build(make_cfg, overrides)
    assert dataset.case_refs()[0].label_path == odd


def test_mrbrains_labels_are_merged_into_grey_white_csf(make_cfg, tmp_path):
    for name, raw_to_class in (("mrbrains", {1: 3, 2: 1, 3: 2}), ("mrbrains2018", {1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3, 7: 0})):
        root, overrides = fake_download(name, tmp_path / name)
        dataset, _ = build(make_cfg, overrides + ["dataset.preprocess.crop_to_nonzero=false"])
        ref = dataset.case_refs()[0]
        raw = np.asarray(nib.load(str(ref.label_path)).dataobj)
        label = dataset.load(ref).label
        for value, cls in raw_to_class.items():
            if (raw == value).any():
                assert np.all(label[raw == value] == cls), (name, value)
        assert [p.name.split(".")[0] for p in ref.image_paths] == (
            ["T1", "T1_IR", "T2_FLAIR"] if name == "mrbrains" else ["reg_T1", "reg_IR", "FLAIR"])


def test_nnunet_dataset_json_drives_classes_channels_and_regions(make_cfg, tmp_path):
    root, overrides = fake_download("nnunet_regions", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    assert dataset.regions == {"whole": [1, 2, 3], "core": [2, 3], "inner": [3]}
    assert dataset.label_classes == 4
    flat, _ = build(make_cfg, overrides + ["dataset.multilabel=false"])
    assert flat.num_classes == 4 and not flat.multilabel and flat.class_names[3] == "inner"
    desc = json.loads((root / "dataset.json").read_text())
    desc["numTraining"] = 99
    desc["dataset"] = {"only": {"images": ["imagesTr/fake_001_0000.nii.gz", "imagesTr/fake_001_0001.nii.gz"],
                                "label": "labelsTr/fake_001.nii.gz"}}
    (root / "dataset.json").write_text(json.dumps(desc))
    listed, _ = build(make_cfg, overrides)
    assert [r.case_id for r in listed.case_refs()] == ["only"]
    desc["dataset"]["only"]["label"] = "../../outside.nii.gz"
    (root / "dataset.json").write_text(json.dumps(desc))
    with pytest.raises(ValueError, match="outside the dataset root"):
        build(make_cfg, overrides)[0].case_refs()


def test_nnunet_count_mismatch_is_a_warning_and_channel_files_are_checked(make_cfg, tmp_path):
    root, overrides = fake_download("nnunet", tmp_path)
    desc = json.loads((root / "dataset.json").read_text())
    desc["numTraining"] = 7
    (root / "dataset.json").write_text(json.dumps(desc))
    (root / "imagesTr/fake_002_0001.nii.gz").unlink()
    dataset, _ = build(make_cfg, overrides)
    refs = dataset.case_refs()
    assert len(refs) == 6 and any("numTraining=7" in w for w in dataset.layout_warnings)
    with pytest.raises(VolumeError, match="fake_002_0001.nii.gz: file not found"):
        dataset.load(refs[2])


def test_flare_ct_is_clipped_to_the_window_and_a_missing_mask_is_named(make_cfg, tmp_path):
    root, overrides = fake_download("flare", tmp_path)
    dataset, _ = build(make_cfg, overrides + ["dataset.preprocess.target_spacing=null"])
    assert dataset.normalization["clip"] == [-160, 240]
    ref = dataset.case_refs()[0]
    hu = np.asarray(nib.load(str(ref.image_paths[0])).dataobj).astype(np.float32)
    clipped = np.clip(hu, -160, 240)
    expected = (clipped - clipped.mean()) / clipped.std()
    case = dataset.load(ref)
    assert case.image.min() == pytest.approx(expected.min(), abs=1e-4)  # air sits at the window's floor
    assert case.image.max() == pytest.approx(expected.max(), abs=1e-4)
    (root / "TrainingMask/train_003.nii.gz").unlink()
    dataset, _ = build(make_cfg, overrides)
    with pytest.raises(VolumeError, match="TrainingMask/train_003.nii.gz: file not found"):
        dataset.load(dataset.case_refs()[2])


def test_prostate_has_two_channels_normalised_separately(make_cfg, tmp_path):
    root, overrides = fake_download("prostate", tmp_path)
    dataset, _ = build(make_cfg, overrides)
    assert dataset.class_names == ["background", "peripheral_zone", "transition_zone"]
    case = dataset.load(dataset.case_refs()[0])
    assert case.image.shape[0] == 2
    np.testing.assert_allclose(case.image.reshape(2, -1).mean(1), 0, atol=0.05)  # z-scored per channel
    np.testing.assert_allclose(case.image.reshape(2, -1).std(1), 1, atol=0.05)


def test_brats_2023_names_with_dashes_and_label_3(tmp_path):
    """BraTS 2023 names files <case>-t1n.nii.gz ... and already uses 3 for enhancing tumour."""
    from tests import fake_datasets as fd

    from mcseg.data.brats import BraTSDataset

    top = fd.write_brats(tmp_path / "b", year=2021, n_cases=2)
    for folder in sorted(top.iterdir()):
        new = folder.with_name(folder.name.replace("BraTS2021_", "BraTS-GLI-") + "-000")
        folder.rename(new)
        for old_mod, new_mod in zip(("t1", "t1ce", "t2", "flair", "seg"), ("t1n", "t1c", "t2w", "t2f", "seg")):
            src = new / f"{folder.name}_{old_mod}.nii.gz"
            img = nib.load(str(src))
            data = np.asarray(img.dataobj)
            data = np.where(data == 4, 3, data).astype(data.dtype) if old_mod == "seg" else data
            nib.save(nib.Nifti1Image(data, img.affine), str(new / f"{new.name}-{new_mod}.nii.gz"))
            src.unlink()
    dataset = BraTSDataset(str(top), modalities=["t1n", "t1c", "t2w", "t2f"], label_mapping=None)
    refs = dataset.case_refs()
    assert [r.case_id for r in refs] == ["BraTS-GLI-00000-000", "BraTS-GLI-00001-000"]
    assert refs[0].label_path.name == "BraTS-GLI-00000-000-seg.nii.gz"
    assert set(np.unique(dataset.load(refs[0]).label)) == {0, 1, 2, 3}

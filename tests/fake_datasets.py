"""Small datasets written by tests in the real on-disk layouts and formats.

Each writer lays out a folder as the dataset's download does (folder names, file names,
NIfTI with anisotropic spacings and oblique or flipped affines, label conventions) with
phantom anatomy (:func:`mcseg.data.synthetic.phantom`), small enough for CPU tests.
"""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np

from mcseg.data.synthetic import phantom


def make_affine(spacing, origin=(0.0, 0.0, 0.0), rotation_deg: float = 0.0, flips=()) -> np.ndarray:
    """A voxel-to-world affine: ``spacing`` per axis, rotated about the third axis, axes in ``flips`` negated."""
    t = np.deg2rad(rotation_deg)
    rot = np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
    direction = rot.copy()
    for axis in flips:
        direction[:, axis] *= -1
    affine = np.eye(4)
    affine[:3, :3] = direction * np.asarray(spacing, dtype=np.float64)[None, :]
    affine[:3, 3] = origin
    return affine


def save(path: Path, array: np.ndarray, affine: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(array, affine)
    img.header.set_xyzt_units("mm", "sec")
    nib.save(img, str(path))
    return path


def volume_phantom(shape, seed: int, index: int, z_step: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A coherent 3D phantom, optionally keeping every ``z_step``-th slice (thick-slice acquisitions)."""
    full = (shape[0], shape[1], shape[2] * z_step)
    image, label = phantom(full, seed, index)
    return image[..., ::z_step], label[..., ::z_step]


def write_msd(root: Path, n_cases: int = 6, shape=(24, 28, 20), spacing=(0.9, 0.9, 2.5), channels: int = 1,
              seed: int = 0, prefix: str = "case", modalities: dict | None = None, labels: dict | None = None,
              affine: np.ndarray | None = None, z_step: int = 1) -> Path:
    """An MSD task folder (dataset.json, imagesTr/, labelsTr/) of 3-class phantoms with an offset affine
    (``z_step`` > 1: thick slices cut from a finer phantom)."""
    (root / "imagesTr").mkdir(parents=True, exist_ok=True)
    (root / "labelsTr").mkdir(parents=True, exist_ok=True)
    if affine is None:
        affine = np.diag(list(spacing) + [1.0])
        affine[:3, 3] = (-40.0, 12.5, 7.0)
    training = []
    for i in range(n_cases):
        image, label = phantom(tuple(shape), seed, i) if z_step == 1 else volume_phantom(shape, seed, i, z_step)
        label = np.where(label >= 2, 2, label)  # 3 classes: background, crescent, ring+pool
        data = image if channels == 1 else np.stack([image * (c + 1) for c in range(channels)], axis=-1)
        name = f"{prefix}_{i:03d}.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.float32), affine), str(root / "imagesTr" / name))
        nib.save(nib.Nifti1Image(label.astype(np.uint8), affine), str(root / "labelsTr" / name))
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    description = {
        "name": "fake", "tensorImageSize": "4D" if channels > 1 else "3D",
        "modality": modalities or {str(c): f"MR{c}" for c in range(channels)},
        "labels": labels or {"0": "background", "1": "crescent", "2": "core"},
        "numTraining": n_cases, "training": training,
    }
    (root / "dataset.json").write_text(json.dumps(description, indent=1))
    return root


# --------------------------------------------------------------------------- ACDC
ACDC_GROUPS = ("NOR", "MINF", "DCM", "HCM", "RV")


def write_acdc(root: Path, n_train: int = 10, n_test: int = 4, shape=(40, 36, 6), spacing=(1.5625, 1.5625, 10.0),
               seed: int = 0, test_labels: bool = True) -> Path:
    """``<root>/database/{training,testing}/patientXXX/`` with Info.cfg, the 4D sequence and the
    ED/ES frames with their ``_gt`` label maps (0 bg, 1 RV, 2 myocardium, 3 LV); an oblique
    short-axis affine with thick slices. Returns the ``database`` folder."""
    database = root / "database"
    n_frames = 8
    for part, first, count in (("training", 1, n_train), ("testing", 101, n_test)):
        for k in range(count):
            number = first + k
            pid = f"patient{number:03d}"
            folder = database / part / pid
            folder.mkdir(parents=True, exist_ok=True)
            group = ACDC_GROUPS[k % len(ACDC_GROUPS)]
            ed, es = 1, 4 + k % 3
            (folder / "Info.cfg").write_text(
                f"ED: {ed}\nES: {es}\nGroup: {group}\nHeight: 178.0\nNbFrame: {n_frames}\nWeight: 81.0\n"
            )
            affine = make_affine(spacing, origin=(-120.0 + k, 80.0, -40.0), rotation_deg=25.0 + 5 * (k % 4))
            frames = {}
            for frame in (ed, es):
                image, label = volume_phantom(shape, seed, 2 * number + (frame == es), z_step=int(round(spacing[2] / spacing[0])))
                frames[frame] = (image * 400).astype(np.int16)
                save(folder / f"{pid}_frame{frame:02d}.nii.gz", frames[frame], affine)
                if part == "training" or test_labels:
                    save(folder / f"{pid}_frame{frame:02d}_gt.nii.gz", label.astype(np.uint8), affine)
            seq = np.stack([frames[ed] if t + 1 != es else frames[es] for t in range(n_frames)], axis=-1)
            four_d = affine.copy()
            save(folder / f"{pid}_4d.nii.gz", seq, four_d)
    (root / "database" / "MANDATORY_CITATION.md").write_text("Bernard et al., IEEE TMI 2018.\n")
    return database


# --------------------------------------------------------------------------- FLARE 2021
def write_flare(root: Path, n_cases: int = 6, shape=(36, 32, 10), spacing=(0.9, 0.9, 3.0), seed: int = 0) -> Path:
    """``TrainingImg/train_XXX_0000.nii.gz`` (CT in HU, int16) and ``TrainingMask/train_XXX.nii.gz``
    (1 liver, 2 kidneys, 3 spleen, 4 pancreas); LPS-like flipped axes as scanners write them."""
    for i in range(n_cases):
        image, label = volume_phantom(shape, seed, i, z_step=3)
        # a fourth organ: a small blob away from the others
        grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1).astype(np.float32)
        blob = (((grid - np.array([shape[0] * 0.2, shape[1] * 0.75, shape[2] / 2])) / np.array([4, 3, 2])) ** 2).sum(-1) <= 1
        label = np.where(blob & (label == 0), 4, label)
        body = (((grid - np.array(shape) / 2) / (np.array(shape) * 0.48)) ** 2)[..., :2].sum(-1) <= 1
        hu = np.where(body, -100 + 200 * image, -1000).astype(np.float32)
        hu[label == 4] += 60
        case = f"train_{i + 1:03d}"
        affine = make_affine(spacing, origin=(170.0, 160.0, -300.0 + i), flips=(0, 1))
        save(root / "TrainingImg" / f"{case}_0000.nii.gz", hu.round().astype(np.int16), affine)
        save(root / "TrainingMask" / f"{case}.nii.gz", label.astype(np.uint8), affine)
    return root


# --------------------------------------------------------------------------- BraTS
BRATS_MODALITIES = ("t1", "t1ce", "t2", "flair")


def _brats_case(folder: Path, case_id: str, shape, seed: int, index: int) -> None:
    image, label = phantom(tuple(shape), seed, index)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1).astype(np.float32)
    brain = (((grid - np.array(shape) / 2) / (np.array(shape) * 0.46)) ** 2).sum(-1) <= 1
    seg = np.select([label == 1, label == 2, label == 3], [2, 1, 4], 0)  # oedema, necrosis, enhancing
    seg = np.where(brain, seg, 0)
    affine = make_affine((1.0, 1.0, 1.0), origin=(0.0, -239.0, 0.0), flips=(0, 1))
    for m, mod in enumerate(BRATS_MODALITIES):
        data = np.where(brain, (image * (300 + 150 * m) + 50 * m).round(), 0).astype(np.int16)
        save(folder / f"{case_id}_{mod}.nii.gz", data, affine)
    save(folder / f"{case_id}_seg.nii.gz", seg.astype(np.uint8), affine)


def write_brats(root: Path, year: int = 2020, n_cases: int = 6, shape=(32, 36, 28), seed: int = 0) -> Path:
    """A BraTS training folder in the layout of ``year`` (2019: HGG/LGG; 2020; 2021); labels 0, 1, 2, 4.
    Returns the folder to give as ``dataset.root``."""
    if year == 2019:
        top = root / "MICCAI_BraTS_2019_Data_Training"
        for i in range(n_cases):
            grade = "HGG" if i % 3 else "LGG"
            case = f"BraTS19_TCIA0{i % 3}_{100 + i}_1"
            _brats_case(top / grade / case, case, shape, seed, i)
        (top / "survival_data.csv").write_text("BraTS19ID,Age,Survival,ResectionStatus\n")
    elif year == 2020:
        top = root / "MICCAI_BraTS2020_TrainingData"
        for i in range(n_cases):
            case = f"BraTS20_Training_{i + 1:03d}"
            _brats_case(top / case, case, shape, seed, i)
        (top / "name_mapping.csv").write_text("Grade,BraTS_2019_subject_ID,BraTS_2020_subject_ID\n")
    elif year == 2021:
        top = root / "RSNA_ASNR_MICCAI_BraTS2021_TrainingData_16July2021"
        for i in range(n_cases):
            case = f"BraTS2021_{i:05d}"
            _brats_case(top / case, case, shape, seed, i)
    else:
        raise ValueError(year)
    return top


# --------------------------------------------------------------------------- MSD Task05 prostate
def write_prostate(root: Path, n_cases: int = 6, shape=(36, 36, 8), spacing=(0.6, 0.6, 3.6), seed: int = 0) -> Path:
    """``Task05_Prostate``: dataset.json, 4D NIfTI (T2, ADC on the last axis), labels 1 PZ, 2 TZ."""
    top = root / "Task05_Prostate"
    affine = make_affine(spacing, origin=(-60.0, -50.0, -20.0), rotation_deg=8.0)
    return write_msd(top, n_cases=n_cases, shape=shape, spacing=spacing, channels=2, seed=seed, prefix="prostate",
                     modalities={"0": "T2", "1": "ADC"}, labels={"0": "background", "1": "PZ", "2": "TZ"},
                     affine=affine, z_step=int(round(spacing[2] / spacing[0])))


# --------------------------------------------------------------------------- MRBrainS
def _head(shape, seed: int, index: int):
    image, label = phantom(tuple(shape), seed, index)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1).astype(np.float32)
    head = (((grid - np.array(shape) / 2) / (np.array(shape) * 0.47)) ** 2).sum(-1) <= 1
    return image, np.where(head, label, 0), head


def write_mrbrains(root: Path, edition: int = 2013, n_cases: int = 5, shape=(36, 36, 10), seed: int = 0) -> Path:
    """2013: ``TrainingData/<n>/{T1,T1_IR,T2_FLAIR,LabelsForTraining,LabelsForTesting}.nii``;
    2018: ``training/<n>/pre/{reg_T1,reg_IR,FLAIR}.nii.gz`` and ``segm.nii.gz``. 0.958 x 0.958 x 3 mm."""
    spacing = (0.958, 0.958, 3.0)
    affine = make_affine(spacing, origin=(-115.0, -115.0, -70.0), rotation_deg=0.0, flips=(0,))
    subjects = ["1", "4", "5", "7", "14", "070", "148"] if edition == 2018 else [str(i + 1) for i in range(n_cases)]
    for k, subject in enumerate(subjects[:n_cases]):
        image, label, head = _head(shape, seed, k)
        # phantom classes: 1 crescent, 2 ring, 3 pool -> CSF, grey matter, white matter
        if edition == 2013:
            folder = root / "TrainingData" / subject
            testing = np.select([label == 1, label == 2, label == 3], [1, 2, 3], 0)  # 1 CSF, 2 GM, 3 WM
            training = np.select([label == 1, label == 2, label == 3], [5, 1, 3], 0)
            for name, scale in (("T1", 1.0), ("T1_IR", 0.7), ("T2_FLAIR", 1.3)):
                save(folder / f"{name}.nii", np.where(head, image * 500 * scale, 0).astype(np.float32), affine)
            save(folder / "LabelsForTesting.nii", testing.astype(np.uint8), affine)
            save(folder / "LabelsForTraining.nii", training.astype(np.uint8), affine)
        else:
            folder = root / "training" / subject
            segm = np.select([label == 1, label == 2, label == 3], [5, 1, 3], 0)
            segm[(label == 3) & (np.arange(shape[2]) % 4 == 0)] = 4   # white-matter lesions
            segm[(label == 1) & (np.arange(shape[0])[:, None, None] < shape[0] // 2)] = 6  # ventricles
            segm[(label == 2) & (np.arange(shape[1])[None, :, None] < 4)] = 2  # basal ganglia
            segm[head & (label == 0) & (np.arange(shape[2]) == 0)] = 7  # cerebellum
            for name, scale in (("reg_T1", 1.0), ("reg_IR", 0.7), ("FLAIR", 1.3)):
                save(folder / "pre" / f"{name}.nii.gz", np.where(head, image * 500 * scale, 0).astype(np.float32), affine)
            save(folder / "segm.nii.gz", segm.astype(np.uint8), affine)
    return root


# --------------------------------------------------------------------------- nnU-Net v2 raw
def write_nnunet(root: Path, n_cases: int = 6, shape=(28, 24, 12), spacing=(0.8, 0.8, 2.0), seed: int = 0,
                 regions: bool = False) -> Path:
    """``Dataset042_Fake``: dataset.json (channel_names, labels, file_ending), ``imagesTr/<case>_000X.nii.gz``,
    ``labelsTr/<case>.nii.gz``; two channels; ``regions=True`` declares region-based labels."""
    top = root / "Dataset042_Fake"
    affine = make_affine(spacing, origin=(30.0, -20.0, 10.0), rotation_deg=12.0, flips=(1,))
    for i in range(n_cases):
        image, label = phantom(tuple(shape), seed, i)
        case = f"fake_{i:03d}"
        for c in range(2):
            save(top / "imagesTr" / f"{case}_{c:04d}.nii.gz", (image * (c + 1) * 100).astype(np.float32), affine)
        save(top / "labelsTr" / f"{case}.nii.gz", label.astype(np.uint8), affine)
    if regions:
        labels = {"background": 0, "whole": [1, 2, 3], "core": [2, 3], "inner": 3}
    else:
        labels = {"background": 0, "crescent": 1, "ring": 2, "pool": 3}
    description = {"channel_names": {"0": "T1", "1": "T2"}, "labels": labels, "numTraining": n_cases,
                   "file_ending": ".nii.gz"}
    if regions:
        description["regions_class_order"] = [1, 2, 3]
    (top / "dataset.json").write_text(json.dumps(description, indent=1))
    return top


# --------------------------------------------------------------------------- several raters
def rater_maps(label: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """``k`` raters of one structure: each grows (dilates) or shrinks (erodes) the label's foreground by a
    voxel, or leaves it, so raters disagree at the boundary as real ones do."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    maps = []
    for r in range(k):
        move = (r % 3) - 1 if k > 1 else 0
        out = label.copy()
        for value in np.unique(label)[1:]:
            mask = label == value
            if move > 0:
                grown = ndimage.binary_dilation(mask) & (out == 0)
                out[grown] = value
            elif move < 0:
                out[mask & ~ndimage.binary_erosion(mask)] = 0
        if rng.random() < 0.5 and out.any():  # one rater in two also drops a stray voxel of the boundary
            idx = np.argwhere(out > 0)[0]
            out[tuple(idx)] = 0
        maps.append(out.astype(np.uint8))
    return maps


def write_qubiq(root: Path, raters_per_task=(6, 3), n_train: int = 4, n_val: int = 2, shape=(40, 36),
                seed: int = 0, short_case: int | None = 1) -> Path:
    """A QUBIQ dataset folder: ``{Training,Validation}/case<NN>/image.nii.gz`` (2D slices stored as
    ``H x W x 1``) and ``task<TT>_seg<RR>.nii.gz``; task t has ``raters_per_task[t-1]`` raters, except the
    Training case ``short_case`` which has one fewer in task 1 (as in QUBIQ prostate)."""
    top = root / "prostate"
    affine = make_affine((0.6, 0.6, 3.0), origin=(-10.0, 5.0, 2.0))
    for part, count in (("Training", n_train), ("Validation", n_val)):
        for i in range(count):
            image, label = phantom(tuple(shape), seed, i + (100 if part == "Validation" else 0))
            folder = top / part / f"case{i + 1:02d}"
            save(folder / "image.nii.gz", (image * 300).astype(np.float32)[..., None], affine)
            for t, k in enumerate(raters_per_task, start=1):
                if part == "Training" and i + 1 == short_case and t == 1:
                    k -= 1
                structure = (label == t).astype(np.uint8) if t < 3 else (label > 0).astype(np.uint8)
                for r, m in enumerate(rater_maps(structure, k, seed + i * 10 + t), start=1):
                    save(folder / f"task{t:02d}_seg{r:02d}.nii.gz", m[..., None], affine)
    return top


def write_curvas(root: Path, n_raters: int = 3, n_train: int = 4, n_test: int = 2, shape=(28, 24, 10),
                 seed: int = 0, nested: bool = True) -> Path:
    """CURVAS as unzipped: ``training_set/training_set/<case>/`` (nested, as the zip holds it) and
    ``testing_set/<case>/`` with ``image.nii.gz`` (CT in HU) and ``annotation_<r>.nii.gz`` (1 pancreas,
    2 kidney, 3 liver); LPS-flipped axes."""
    affine = make_affine((0.8, 0.8, 2.5), origin=(150.0, 140.0, -200.0), flips=(0, 1))
    for part, count, first in (("training_set", n_train, 1), ("testing_set", n_test, 50)):
        top = root / part / part if nested and part == "training_set" else root / part
        for i in range(count):
            image, label = phantom(tuple(shape), seed, first + i)
            case = f"UKCHLL{first + i:03d}"
            save(top / case / "image.nii.gz", (-100 + 200 * image).round().astype(np.int16), affine)
            for r, m in enumerate(rater_maps(label, n_raters, seed + first + i), start=1):
                save(top / case / f"annotation_{r}.nii.gz", m, affine)
    return root


def write_lidc_crops(root: Path, patients=("LIDC-IDRI-0001", "LIDC-IDRI-0002", "LIDC-IDRI-0003"),
                     slices: int = 2, size: int = 180, seed: int = 0) -> Path:
    """Kohl's PNG crops: ``lidc_crops_<split>/<split>/{images,gt}/<patient>/`` with ``<slice>.png`` (uint8)
    and ``<slice>_l<r>.png`` (0/255) for four raters; the last patient is in ``test``, one in ``val``."""
    import SimpleITK as sitk

    for p, patient in enumerate(patients):
        split = "test" if p == len(patients) - 1 else ("val" if p == 1 else "train")
        top = root / f"lidc_crops_{split}" / split
        for s in range(slices):
            image, label = phantom((size, size), seed, p * 10 + s)
            lesion = (label == 3).astype(np.uint8)  # the pool: a small blob
            stem = f"z-{100 + s}.0_c0"
            (top / "images" / patient).mkdir(parents=True, exist_ok=True)
            (top / "gt" / patient).mkdir(parents=True, exist_ok=True)
            png = np.clip(image / image.max() * 255, 0, 255).astype(np.uint8)
            sitk.WriteImage(sitk.GetImageFromArray(png.T), str(top / "images" / patient / f"{stem}.png"))
            for r, m in enumerate(rater_maps(lesion, 4, seed + p * 10 + s)):
                sitk.WriteImage(sitk.GetImageFromArray((m * 255).astype(np.uint8).T),
                                str(top / "gt" / patient / f"{stem}_l{r}.png"))
    return root


def write_lidc_pickle(root: Path, n_series: int = 3, slices: int = 2, size: int = 128, seed: int = 0) -> Path:
    """Knegt's pickle: ``data_lidc.pickle``, a dict slice id -> {image (float in [0, 1]), masks (4 binary
    maps), series_uid}."""
    import pickle

    data = {}
    for s in range(n_series):
        for k in range(slices):
            image, label = phantom((size, size), seed, s * 10 + k)
            lesion = (label == 3).astype(np.uint8)
            data[f"LIDC-IDRI-{s + 1:04d}_slice_{k}"] = {
                "image": (image / image.max()).astype(np.float32),
                "masks": rater_maps(lesion, 4, seed + s * 10 + k),
                "series_uid": f"1.3.6.1.4.1.14519.5.2.1.6279.{s}",
            }
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "data_lidc.pickle", "wb") as f:
        pickle.dump(data, f)
    return root


def write_nnunet_raters(root: Path, n_raters: int = 3, n_cases: int = 4, shape=(20, 18, 8), seed: int = 0) -> Path:
    """An nnU-Net v2 raw dataset with one labels folder per rater: ``labelsTr_rater<r>/<case>.nii.gz``."""
    top = root / "Dataset043_Raters"
    affine = make_affine((0.8, 0.8, 2.0), origin=(30.0, -20.0, 10.0), rotation_deg=12.0)
    for i in range(n_cases):
        image, label = phantom(tuple(shape), seed, i)
        case = f"rat_{i:03d}"
        save(top / "imagesTr" / f"{case}_0000.nii.gz", (image * 100).astype(np.float32), affine)
        for r, m in enumerate(rater_maps(label, n_raters, seed + i), start=1):
            save(top / f"labelsTr_rater{r}" / f"{case}.nii.gz", m, affine)
    description = {"channel_names": {"0": "T1"}, "labels": {"background": 0, "crescent": 1, "ring": 2, "pool": 3},
                   "numTraining": n_cases, "file_ending": ".nii.gz"}
    (top / "dataset.json").write_text(json.dumps(description, indent=1))
    return top

"""Real prediction folders of other tools for the tests, made with the tools' own code.

* nnU-Net v2: a raw dataset (``dataset.json``, ``imagesTr``, ``labelsTr``, ``splits_final.json``), a
  ``plans.json`` with a transposition and a network spacing other than the images' (so the export resamples,
  un-crops and un-transposes), each case preprocessed by nnU-Net's ``DefaultPreprocessor.run_case`` and its
  "network logits" (the preprocessed label, one-hot or per region, scaled, plus seeded noise) exported by
  ``nnunetv2.inference.export_prediction.export_prediction_from_logits`` with ``save_probabilities=True``:
  the ``<case>.npz`` + ``<case>.pkl`` + ``<case>.nii.gz`` triple that ``nnUNetv2_predict --save_probabilities``
  writes, label-based (softmax) or region-based (sigmoids), 3D or 2D.
* MONAI: ``SaveImage`` (its defaults: ``<name>/<name>_trans.nii.gz``, channel last) of softmax probabilities.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import SimpleITK as sitk

# Array (z, y, x) spacing 0.8, 1.0, 2.5: nnU-Net's transpose_forward puts the largest spacing first: [2, 0, 1]
SPACING_XYZ = (2.5, 1.0, 0.8)
ORIGIN = (-12.0, 7.5, 30.0)
LABELS = {"background": 0, "left": 1, "right": 2}
REGIONS = {"background": 0, "whole": [1, 2], "core": 2}


def blob_label(shape_xyz: tuple[int, ...], seed: int) -> np.ndarray:
    """Two ellipsoids (labels 1 and 2, 2 inside 1), seeded, in file order (x, y[, z])."""
    rng = np.random.default_rng(seed)
    grid = np.meshgrid(*[np.arange(n) for n in shape_xyz], indexing="ij")
    centre = [n / 2 + rng.uniform(-1, 1) for n in shape_xyz]
    radius = [max(n / 3.2, 1.5) for n in shape_xyz]
    d = sum(((g - c) / r) ** 2 for g, c, r in zip(grid, centre, radius))
    label = np.zeros(shape_xyz, np.uint8)
    label[d < 1.0] = 1
    label[d < 0.35] = 2
    return label


# ITK direction cosines far from the identity (axes permuted and flipped), for SimpleITKIOWithReorient
PERMUTED_DIRECTION = (0.0, 0.0, -1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


def _write_itk(path: Path, array_xyz: np.ndarray, spacing, origin, direction=None) -> None:
    """A NIfTI written by SimpleITK from a file-order (x, y[, z]) array, with spacing, origin (and direction)."""
    img = sitk.GetImageFromArray(np.ascontiguousarray(array_xyz.T))
    img.SetSpacing(tuple(float(s) for s in spacing))
    img.SetOrigin(tuple(float(o) for o in origin))
    if direction is not None:
        img.SetDirection(direction)
    sitk.WriteImage(img, str(path))


# a voxel-to-world affine far from RAS (axes permuted and flipped), for nnU-Net's reorienting reader
PERMUTED_AFFINE = np.array([[0.0, 0.0, -0.8, 20.0], [-2.5, 0.0, 0.0, 4.0], [0.0, 1.0, 0.0, -7.0], [0, 0, 0, 1]])


def _plans(dims: int, reader: str = "SimpleITKIO") -> dict:
    kw = {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None}
    seg_kw = {**kw, "is_seg": True}
    # network spacing: coarser in-plane than the images (the export resamples the logits back)
    spacing = [2.5, 1.25, 1.25] if dims == 3 else [1.25, 1.25]
    config = {
        "data_identifier": "tiny", "preprocessor_name": "DefaultPreprocessor", "batch_size": 2,
        "patch_size": [8, 8, 8][:dims], "median_image_size_in_voxels": [8, 8, 8][:dims], "spacing": spacing,
        "normalization_schemes": ["ZScoreNormalization"], "use_mask_for_norm": [False],
        "resampling_fn_data": "resample_data_or_seg_to_shape", "resampling_fn_data_kwargs": {**kw, "order": 3},
        "resampling_fn_seg": "resample_data_or_seg_to_shape", "resampling_fn_seg_kwargs": seg_kw,
        "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
        "resampling_fn_probabilities_kwargs": kw,
        "architecture": {"network_class_name": "none", "arch_kwargs": {}, "_kw_requires_import": []},
        "batch_dice": True,
    }
    transpose = [2, 0, 1] if dims == 3 else [0, 1, 2]
    backward = [int(i) for i in np.argsort(transpose)]
    return {"dataset_name": "Dataset999_Tiny", "plans_name": "nnUNetPlans",
            "original_median_spacing_after_transp": [1.0] * 3, "original_median_shape_after_transp": [8] * 3,
            "image_reader_writer": reader, "transpose_forward": transpose, "transpose_backward": backward,
            "configurations": {"3d_fullres" if dims == 3 else "2d": config},
            "experiment_planner_used": "ExperimentPlanner", "label_manager": "LabelManager",
            "foreground_intensity_properties_per_channel": {"0": {"mean": 0.0, "std": 1.0, "percentile_00_5": -3.0,
                                                                  "percentile_99_5": 3.0}}}


def make_nnunet(root: Path, dims: int = 3, regions: bool = False, n_cases: int = 4, seed: int = 0,
                noise: float = 2.0, members: int = 1, reader: str = "SimpleITKIO") -> dict[str, Path]:
    """Raw dataset, trainer folder (plans.json, dataset.json) and ``members`` prediction folders
    ``fold_<m>/validation`` with every case (the tests pick what they need), each member its own noise.
    ``reader="NibabelIOWithReorient"``: files written by nibabel with :data:`PERMUTED_AFFINE`;
    ``"SimpleITKIOWithReorient"``: by SimpleITK with :data:`PERMUTED_DIRECTION`; read by nnU-Net's reorienting
    readers (3D). Returns the folders by name (``pred``: member 0, ``members``: all)."""
    from nnunetv2.inference.export_prediction import export_prediction_from_logits
    from nnunetv2.preprocessing.preprocessors.default_preprocessor import DefaultPreprocessor
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    raw = root / "raw"
    trainer = root / "results" / "nnUNetTrainer__nnUNetPlans__3d_fullres"
    preds = [trainer / f"fold_{m}" / "validation" for m in range(members)]
    pred = preds[0]
    for d in (raw / "imagesTr", raw / "labelsTr", *preds):
        d.mkdir(parents=True, exist_ok=True)
    labels = REGIONS if regions else LABELS
    dataset = {"channel_names": {"0": "MR"}, "labels": labels, "numTraining": n_cases, "file_ending": ".nii.gz",
               **({"regions_class_order": [1, 2]} if regions else {})}
    plans = _plans(dims, reader)
    for where in (raw, trainer):
        (where / "dataset.json").write_text(json.dumps(dataset))
    (trainer / "plans.json").write_text(json.dumps(plans))
    shape = (9, 12, 7) if dims == 3 else (12, 10)
    spacing, origin = SPACING_XYZ[:dims] if dims == 3 else (0.8, 0.9), ORIGIN[:dims]
    cases = [f"tiny_{i:03d}" for i in range(n_cases)]
    manager = PlansManager(plans)
    configuration = manager.get_configuration(next(iter(plans["configurations"])))
    rng = np.random.default_rng(seed)
    for i, case in enumerate(cases):
        label = blob_label(shape, seed * 100 + i)
        image = rng.normal(size=shape).astype(np.float32) + label
        image[0] = 0.0  # a zero slab that nnU-Net crops away (and restores as background)
        if reader.startswith("Nibabel"):
            nib.save(nib.Nifti1Image(image, PERMUTED_AFFINE), str(raw / "imagesTr" / f"{case}_0000.nii.gz"))
            nib.save(nib.Nifti1Image(label, PERMUTED_AFFINE), str(raw / "labelsTr" / f"{case}.nii.gz"))
        else:
            direction = PERMUTED_DIRECTION if reader == "SimpleITKIOWithReorient" else None
            _write_itk(raw / "imagesTr" / f"{case}_0000.nii.gz", image, spacing, origin, direction)
            _write_itk(raw / "labelsTr" / f"{case}.nii.gz", label, spacing, origin, direction)
        pre = DefaultPreprocessor(verbose=False)
        _, seg, props = pre.run_case([str(raw / "imagesTr" / f"{case}_0000.nii.gz")],
                                     str(raw / "labelsTr" / f"{case}.nii.gz"), manager, configuration, dataset)
        props.pop("class_locations", None)  # training's sampling hints: not in a prediction's properties
        seg = seg[0].astype(np.int64)  # network space (transposed, cropped, resampled)
        if regions:
            channels = np.stack([np.isin(seg, [1, 2]), seg == 2]).astype(np.float32)
            clean = (channels * 2 - 1) * 4.0
        else:
            clean = np.eye(3, dtype=np.float32)[np.clip(seg, 0, None)].transpose(-1, *range(seg.ndim)) * 4.0
        import torch

        for folder in preds:
            logits = clean + rng.normal(scale=noise, size=clean.shape).astype(np.float32)
            export_prediction_from_logits(torch.from_numpy(logits), dict(props), configuration, manager, dataset,
                                          str(folder / case), save_probabilities=True, num_threads_torch=1)
    splits = [{"train": [c for c in cases if c not in val], "val": val}
              for val in (cases[k::2] for k in range(2))]
    (raw / "splits_final.json").write_text(json.dumps(splits))
    return {"raw": raw, "trainer": trainer, "pred": pred, "members": preds, "labels": raw / "labelsTr",
            "splits": raw / "splits_final.json"}


def copy_folder(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def make_monai(root: Path, label_dir: Path, noise: float = 1.5, seed: int = 0, classes: int = 3) -> Path:
    """Softmax probabilities of each label of ``label_dir`` saved by MONAI's ``SaveImage`` (its defaults but
    the folder), with the label's affine as metadata: ``root/<case>/<case>_trans.nii.gz``."""
    import torch
    from monai.data import MetaTensor
    from monai.transforms import SaveImage

    saver = SaveImage(output_dir=str(root), print_log=False)
    rng = np.random.default_rng(seed)
    for path in sorted(label_dir.glob("*.nii.gz")):
        img = nib.load(str(path))
        label = np.asarray(img.dataobj).astype(np.int64)
        logits = np.eye(classes, dtype=np.float32)[label].transpose(-1, *range(label.ndim)) * 3.0
        logits += rng.normal(scale=noise, size=logits.shape).astype(np.float32)
        probs = torch.softmax(torch.from_numpy(logits), 0)
        meta = {"original_affine": torch.as_tensor(img.affine),
                "filename_or_obj": str(path), "spatial_shape": label.shape}
        saver(MetaTensor(probs, affine=torch.as_tensor(img.affine), meta=meta))
    return root


STUDY_AFFINE = np.diag([1.2, 0.9, 2.0, 1.0])


def make_monai_study(root: Path, n_cases: int, n_fit: int, noise: float, name: str = "case_{i:02d}") -> dict:
    """``n_cases`` 10 x 9 x 5 blob cases under ``root`` on :data:`STUDY_AFFINE`: their labels (``labels``), images
    (``images``, ``<case>_0000.nii.gz``: label x 40 plus noise) and MONAI SaveImage probabilities of the first
    ``n_fit`` (``fit``) and of the others (``new``), each made with ``noise``; case ``i`` is named ``name.format(i=i)``."""
    rng = np.random.default_rng(0)
    for i in range(n_cases):
        case = name.format(i=i)
        label = blob_label((10, 9, 5), seed=i)
        for part in ("labels", "fit_labels" if i < n_fit else "new_labels"):
            (root / part).mkdir(exist_ok=True)
            nib.save(nib.Nifti1Image(label, STUDY_AFFINE), str(root / part / f"{case}.nii.gz"))
        (root / "images").mkdir(exist_ok=True)
        image = (label * 40 + rng.normal(0, 5, label.shape)).astype(np.float32)
        nib.save(nib.Nifti1Image(image, STUDY_AFFINE), str(root / "images" / f"{case}_0000.nii.gz"))
    return {"root": root, "labels": root / "labels", "images": root / "images",
            "fit": make_monai(root / "fit", root / "fit_labels", noise=noise, seed=1),
            "new": make_monai(root / "new", root / "new_labels", noise=noise, seed=2)}

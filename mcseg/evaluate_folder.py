"""``mcseg-evaluate-folder PRED_DIR LABEL_DIR [--probs PROBS_DIR] [--num-classes K]``

Evaluates label maps made by any tool against reference labels with mcseg's protocol
(docs/protocol.md): cases are matched by file name (``<case>.nii.gz`` in both folders), the
geometry of each pair (shape, spacing, affine) must agree, and with ``--probs`` the
probability maps ``<case>_probs.nii.gz`` (channel last, X x Y x Z x C, as mcseg writes them)
add the calibration metrics. Dice, HD95 and ASSD score the given label maps; calibration
scores the probabilities (top-label correctness from their argmax).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from mcseg.data.io import Volume, VolumeError, read_volume, write_nifti
from mcseg.evaluation.evaluator import EvalProtocol, Evaluator, entropy_map
from mcseg.metrics.regions import REGIONS
from mcseg.metrics.surface import HD_DEFINITIONS

__all__ = ["FolderError", "evaluate_folder", "main"]

_SUFFIXES = (".nii.gz", ".nii")
_DERIVED = ("_probs", "_entropy")


class FolderError(ValueError):
    """The folders cannot be evaluated together; the message names the case or file."""


def _case_files(folder: Path, suffix_tag: str = "") -> dict[str, Path]:
    """``{case: path}`` of the NIfTI files of ``folder`` named ``<case><suffix_tag>.nii[.gz]``."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a folder")
    files = {}
    for path in sorted(folder.iterdir()):
        suffix = next((s for s in _SUFFIXES if path.name.endswith(s)), None)
        if suffix is None or not path.is_file():
            continue
        stem = path.name[: -len(suffix)]
        if suffix_tag:
            if stem.endswith(suffix_tag):
                files[stem[: -len(suffix_tag)]] = path
        elif not stem.endswith(_DERIVED):
            if stem in files:
                raise FolderError(f"{folder}: case {stem!r} appears as both .nii and .nii.gz")
            files[stem] = path
    return files


def _same_geometry(case: str, what: str, vol: Volume, ref: Volume, ref_path: Path, path: Path) -> None:
    if vol.spatial_shape != ref.spatial_shape:
        raise FolderError(f"case {case}: {what} {path.name} has spatial shape {vol.spatial_shape}, "
                          f"label {ref_path.name} has {ref.spatial_shape}")
    if not np.allclose(vol.spacing, ref.spacing, rtol=1e-5, atol=1e-6):
        raise FolderError(f"case {case}: {what} {path.name} has spacing {vol.spacing} mm, "
                          f"label {ref_path.name} has {ref.spacing} mm")
    if not np.allclose(vol.affine, ref.affine, rtol=1e-5, atol=1e-4):
        diff = float(np.abs(vol.affine - ref.affine).max())
        raise FolderError(f"case {case}: {what} {path.name} and label {ref_path.name} have different affines "
                          f"(largest difference {diff:.3g}):\n{vol.affine}\nvs\n{ref.affine}")


def _integer_map(case: str, vol: Volume, path: Path) -> np.ndarray:
    arr = np.asarray(vol.array)
    if arr.ndim != len(vol.spacing):
        raise FolderError(f"case {case}: {path.name} has shape {arr.shape}; a label map has one value per voxel")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.array_equal(arr, np.round(arr)):
            raise FolderError(f"case {case}: {path.name} holds non-integer values; expected a label map")
    return arr.astype(np.int64)


def _task_classes(label_dir: Path, num_classes: int | None, class_names: list[str] | None,
                  probs_channels: int | None) -> tuple[int, list[str]]:
    """K and class names: options, else dataset.json of the label folder or its parent, else the
    probability maps' channels. Never inferred from the labels present."""
    declared = None
    for candidate in (label_dir / "dataset.json", label_dir.parent / "dataset.json"):
        if candidate.is_file():
            labels = json.loads(candidate.read_text()).get("labels")
            if isinstance(labels, dict):
                declared = [labels[k] for k in sorted(labels, key=int)]
                break
    k = num_classes or (len(class_names) if class_names else None) or (len(declared) if declared else None) \
        or probs_channels
    if k is None:
        raise FolderError("cannot tell the number of classes: pass --num-classes K (or --probs, or put a "
                          "dataset.json with 'labels' beside the labels)")
    if declared is not None and len(declared) != k and not class_names:
        raise FolderError(f"--num-classes {k} disagrees with dataset.json, which declares {len(declared)} labels")
    names = class_names or (declared if declared and len(declared) == k else
                            ["background"] + [f"class_{i}" for i in range(1, k)])
    if len(names) != k:
        raise FolderError(f"{len(names)} class names for {k} classes: {names}")
    return k, list(names)


def evaluate_folder(pred_dir: Path, label_dir: Path, probs_dir: Path | None = None, num_classes: int | None = None,
                    class_names: list[str] | None = None, protocol: EvalProtocol | None = None,
                    output_dir: Path | None = None, allow_missing: bool = False) -> dict:
    """Evaluate every prediction of ``pred_dir``; write the outputs to ``output_dir``
    (default ``pred_dir/eval``) and return the summary."""
    protocol = protocol or EvalProtocol()
    pred_dir, label_dir = Path(pred_dir), Path(label_dir)
    preds, labels = _case_files(pred_dir), _case_files(label_dir)
    probs_files = _case_files(Path(probs_dir), "_probs") if probs_dir is not None else {}
    if not preds:
        raise FolderError(f"{pred_dir}: no <case>.nii.gz prediction files")
    if missing := sorted(set(preds) - set(labels)):
        raise FolderError(f"{len(missing)} prediction(s) without a label in {label_dir}: {', '.join(missing[:10])}")
    if (unpredicted := sorted(set(labels) - set(preds))) and not allow_missing:
        raise FolderError(f"{len(unpredicted)} label(s) without a prediction in {pred_dir}: "
                          f"{', '.join(unpredicted[:10])} (pass --allow-missing to evaluate the others)")
    if probs_dir is not None and (missing := sorted(set(preds) - set(probs_files))):
        raise FolderError(f"{len(missing)} case(s) without <case>_probs.nii.gz in {probs_dir}: {', '.join(missing[:10])}")
    if protocol.save_uncertainty and probs_dir is None:
        raise FolderError("--save-uncertainty needs the probability maps (--probs)")
    channels = None
    if probs_files:  # header only: the channel count of the first probability map
        import nibabel as nib

        channels = int(nib.load(str(probs_files[next(iter(preds))])).shape[-1])
    k, names = _task_classes(label_dir, num_classes, class_names, channels)
    evaluator = Evaluator(k, names, protocol)
    for case, pred_path in preds.items():
        label_vol = read_volume(labels[case])
        pred_vol = read_volume(pred_path, spatial_dims=len(label_vol.spacing))
        _same_geometry(case, "prediction", pred_vol, label_vol, labels[case], pred_path)
        label = torch.from_numpy(_integer_map(case, label_vol, labels[case]))
        pred = torch.from_numpy(_integer_map(case, pred_vol, pred_path))
        probs = None
        if probs_files:
            probs_vol = read_volume(probs_files[case], spatial_dims=len(label_vol.spacing))
            _same_geometry(case, "probabilities", probs_vol, label_vol, labels[case], probs_files[case])
            if probs_vol.array.ndim != label.ndim + 1 or probs_vol.array.shape[-1] != k:
                raise FolderError(f"case {case}: {probs_files[case].name} has shape {probs_vol.array.shape}, "
                                  f"expected {tuple(label.shape) + (k,)} (channel last, {k} classes)")
            probs = torch.from_numpy(np.ascontiguousarray(np.moveaxis(probs_vol.array, -1, 0), dtype=np.float32))
        try:
            evaluator.add_case(case, probs, label, label_vol.spacing, prediction=pred)
        except ValueError as exc:
            raise FolderError(str(exc)) from None
        if protocol.save_uncertainty:
            write_nifti(pred_dir / f"{case}_entropy.nii.gz", entropy_map(probs).numpy(), label_vol.affine, labels[case])
    return evaluator.write(Path(output_dir) if output_dir is not None else pred_dir / "eval")


def _parser() -> argparse.ArgumentParser:
    defaults = EvalProtocol()
    p = argparse.ArgumentParser(
        prog="mcseg-evaluate-folder",
        description="Evaluate NIfTI label maps (and optional probability maps) against reference labels: "
                    "Dice, HD95 and ASSD in mm, calibration (ECE, MCE, classwise and adaptive ECE, NLL, Brier). "
                    "Writes per_case.csv, summary.json and reliability diagrams.")
    p.add_argument("pred_dir", type=Path, help="folder of <case>.nii.gz label maps")
    p.add_argument("label_dir", type=Path, help="folder of <case>.nii.gz reference labels")
    p.add_argument("--probs", type=Path, dest="probs_dir", help="folder of <case>_probs.nii.gz (X x Y x Z x C)")
    p.add_argument("--num-classes", type=int, help="number of classes K of the task, background included "
                   "(default: dataset.json beside the labels, else the probability channels)")
    p.add_argument("--class-names", nargs="+", help="K class names, background first")
    p.add_argument("-o", "--output-dir", type=Path, help="where to write the results (default: PRED_DIR/eval)")
    p.add_argument("--allow-missing", action="store_true", help="evaluate even if some labels have no prediction")
    p.add_argument("--region", choices=REGIONS, default=defaults.region, help="voxels used for calibration")
    p.add_argument("--n-bins", type=int, default=defaults.n_bins)
    p.add_argument("--boundary-width-mm", type=float, default=defaults.boundary_width_mm)
    p.add_argument("--hd-percentile", type=float, default=defaults.hd_percentile)
    p.add_argument("--hd-definition", choices=HD_DEFINITIONS, default=defaults.hd_definition)
    p.add_argument("--bootstrap-samples", type=int, default=defaults.bootstrap_samples)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--save-uncertainty", action="store_true",
                   help="write <case>_entropy.nii.gz (voxelwise entropy, nats) beside each prediction")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        # the protocol's keys this command has options for (failure detection needs a predictor's members: not here)
        protocol = EvalProtocol(**{f.name: getattr(args, f.name) for f in fields(EvalProtocol) if hasattr(args, f.name)})
        summary = evaluate_folder(args.pred_dir, args.label_dir, args.probs_dir, args.num_classes, args.class_names,
                                  protocol, args.output_dir, args.allow_missing)
    except (FolderError, VolumeError, ValueError) as exc:
        print(f"mcseg-evaluate-folder: error: {exc}", file=sys.stderr)
        return 2
    from mcseg.evaluation.split import format_summary

    names = ["background", *summary["classes"]]
    print(format_summary(summary, names, title=f"{args.pred_dir}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

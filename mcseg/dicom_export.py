"""``mcseg-dicom EVAL_DIR [--cases ID ...] [--images DIR] [--out DIR]``: an evaluation's outputs as DICOM.

For each case of an evaluation folder (``<run>/eval/<split>`` of ``evaluate.py``, or an ``mcseg-evaluate-folder``
output; default: every case of its per_case.csv), found as report.html finds them (:mod:`mcseg.report.case_files`:
predictions, ``_probs``, ``_entropy``, conformal masks, and the image in ``--images`` or the dataset's folder):
``<out>/<case>/series/`` the image as a DICOM series (geometry from its NIfTI affine), and beside it the
probabilities (FRACTIONAL / PROBABILITY Segmentation), the prediction and the conformal sure / possible masks
(BINARY Segmentations) and the uncertainty (Parametric Map), all referencing that series
(:mod:`mcseg.evaluation.dicom`; viewers: docs/report_html.md). A case's folder appears complete or not at all:
it is written under ``<case>.partial`` and renamed at the end. Default ``--out``: ``EVAL_DIR/dicom``.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from mcseg.evaluation.dicom import DicomError, write_case, write_series
from mcseg.report.case_files import case_files


def _read(path: Path):
    import nibabel as nib

    img = nib.load(str(path))
    return np.asanyarray(img.dataobj), img.affine


def export_case(folder: Path, summary: dict, case: str, out: Path, images: Path | None = None) -> list[Path]:
    """Write ``out/<case>/`` (module docstring) for ``case`` of the evaluation in ``folder``; the files written."""
    files = case_files(folder, summary, case, images=images)
    if files.image is None:
        raise DicomError(f"case {case}: no image found (give --images <folder of {case}.nii.gz or "
                         f"{case}_0000.nii.gz>): the DICOM objects reference the image's series")
    if files.prediction is None and files.probabilities is None:
        raise DicomError(f"case {case}: no prediction or probabilities in {folder / 'predictions'}")
    image, affine = _read(files.image)
    image = image[..., 0] if image.ndim == 4 else image
    reference = files.prediction or files.probabilities
    _, output_affine = _read(reference)
    if not np.allclose(affine, output_affine, atol=1e-3):
        raise DicomError(f"{files.image}: its affine differs from that of {reference} (the outputs are not on the "
                         f"image's grid):\n{np.round(affine, 4)}\nagainst\n{np.round(output_affine, 4)}")
    classes = ["background", *summary.get("classes", [])]
    probabilities = _read(files.probabilities)[0].astype(np.float32) if files.probabilities else None
    if probabilities is not None and len(classes) != probabilities.shape[-1]:
        classes = ["background", *(f"class {k}" for k in range(1, probabilities.shape[-1]))]
    prediction = np.rint(_read(files.prediction)[0]).astype(np.int64) if files.prediction else None
    if prediction is not None and len(classes) < 2:
        classes = ["background", *(f"class {k}" for k in range(1, int(prediction.max()) + 1))]
    uncertainty = _read(files.uncertainty)[0].astype(np.float32) if files.uncertainty else None
    masks = {kind: [_read(p)[0] for p in getattr(files, kind)] for kind in ("sure", "possible") if getattr(files, kind)}
    names = {"probabilities": str(files.probabilities), "prediction": str(files.prediction),
             "uncertainty": str(files.uncertainty), **{k: str(getattr(files, k)[0].parent) for k in masks}}
    partial, final = out / f"{case}.partial", out / case
    shutil.rmtree(partial, ignore_errors=True)
    try:
        series = write_series(image, affine, partial / "series", case, str(files.image))
        written = write_case(partial, case, series, image.shape[:3], classes, probabilities, prediction, uncertainty,
                             masks, names)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return [final / p.relative_to(partial) for p in written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcseg-dicom", description=__doc__.split("\n")[0])
    parser.add_argument("eval_dir", type=Path, help="an evaluation folder (with summary.json and per_case.csv)")
    parser.add_argument("--cases", nargs="+", help="case ids (default: every case of per_case.csv)")
    parser.add_argument("--images", type=Path, help="folder of the images (default: the dataset's folder recorded "
                        "in summary.json)")
    parser.add_argument("--out", type=Path, help="output folder (default: EVAL_DIR/dicom)")
    args = parser.parse_args(argv)
    summary_path = args.eval_dir / "summary.json"
    if not summary_path.is_file():
        print(f"error: {summary_path}: not found (an evaluation folder holds summary.json)", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    cases = args.cases
    if not cases:
        with open(args.eval_dir / "per_case.csv", newline="") as f:
            cases = list(dict.fromkeys(row["case"] for row in csv.DictReader(f)))
    out = args.out or args.eval_dir / "dicom"
    try:
        out.mkdir(parents=True, exist_ok=True)
        for case in cases:
            for path in export_case(args.eval_dir, summary, case, out, args.images):
                print(path)
    except (DicomError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

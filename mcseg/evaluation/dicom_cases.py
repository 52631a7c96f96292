"""An evaluation's cases as DICOM (:mod:`mcseg.evaluation.dicom`): what ``mcseg-dicom`` and ``evaluate.py
save_dicom=true`` write, from the files the evaluation left (:mod:`mcseg.evaluation.case_files`).

Per case, ``<out>/<case>/``: ``series/`` (the NIfTI image as a DICOM series) and the Segmentations and Parametric
Map of :func:`mcseg.evaluation.dicom.write_case`. The image must be on the outputs' grid (same affine), else the
case is refused naming both files. A case's folder appears complete or not at all: it is written under
``<case>.partial`` and renamed at the end.
"""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np

from mcseg.evaluation.case_files import case_files
from mcseg.evaluation.dicom import DicomError, write_case, write_series

DICOM_DIR = "dicom"  # <eval dir>/dicom: the default output folder


def evaluated_cases(folder: Path) -> list[str]:
    """The case ids of an evaluation folder's per_case.csv, in order."""
    with open(Path(folder) / "per_case.csv", newline="") as f:
        return list(dict.fromkeys(row["case"] for row in csv.DictReader(f)))


def _read(path: Path):
    import nibabel as nib

    img = nib.load(str(path))
    return np.asanyarray(img.dataobj), img.affine


def export_case(folder: Path, summary: dict, case: str, out: Path, images: Path | None = None,
                image: Path | None = None) -> list[Path]:
    """Write ``out/<case>/`` (module docstring) for ``case`` of the evaluation in ``folder``, its image the file
    ``image`` or found in ``images`` (else where :func:`case_files` looks); the files written."""
    files = case_files(folder, summary, case, images=images)
    files.image = Path(image) if image is not None else files.image
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


def export_evaluation(folder: Path, summary: dict, images: dict[str, Path],
                      image_dir: Path | None = None) -> list[Path]:
    """Every case of the evaluation in ``folder`` into ``folder/dicom`` (``evaluate.py save_dicom=true``,
    ``mcseg-evaluate-folder --dicom``), each case's image the file ``images[case]`` (the dataset's own), else found
    in ``image_dir`` or where :func:`case_files` looks; the files written."""
    out = Path(folder) / DICOM_DIR
    written = []
    for case in evaluated_cases(folder):
        written += export_case(Path(folder), summary, case, out, image_dir, image=images.get(case))
    return written

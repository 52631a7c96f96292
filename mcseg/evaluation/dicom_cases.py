"""An evaluation's cases as DICOM (:mod:`mcseg.evaluation.dicom`): what ``mcseg-dicom`` and ``evaluate.py
save_dicom=true`` write, from the files the evaluation left (:mod:`mcseg.evaluation.case_files`).

Per case, ``<out>/<case>/``: ``series/`` (the NIfTI image as a DICOM series; none when the image is a DICOM series,
which is referenced as it is: :mod:`mcseg.evaluation.dicom_source`) and the Segmentations and Parametric Map of
:func:`mcseg.evaluation.dicom.write_case`. The image must be on the outputs' grid (same shape and affine), else the
case is refused naming both files. A case's folder appears complete or not at all: it is written under
``<case>.partial`` and renamed at the end.
"""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np

from mcseg.evaluation.case_files import case_files
from mcseg.evaluation.dicom import DicomError, write_case
from mcseg.evaluation.dicom_source import find_image, source_series

DICOM_DIR = "dicom"  # <eval dir>/dicom: the default output folder


def evaluated_cases(folder: Path) -> list[str]:
    """The case ids of an evaluation folder's per_case.csv, in order."""
    with open(Path(folder) / "per_case.csv", newline="") as f:
        return list(dict.fromkeys(row["case"] for row in csv.DictReader(f)))


def _read(path: Path):
    import nibabel as nib

    img = nib.load(str(path))
    return np.asanyarray(img.dataobj), img.affine


def write_case_folder(out: Path, case: str, image: Path, affine: np.ndarray, shape: tuple[int, ...], outputs: str,
                      class_names: list[str], **objects) -> list[Path]:
    """``out/<case>/``: the series of ``image`` (referenced as it is when a DICOM series, else written from the
    NIfTI; :func:`mcseg.evaluation.dicom_source.source_series`, checked against the outputs' ``affine`` and
    ``shape``, ``outputs`` naming their file) and the objects of :func:`mcseg.evaluation.dicom.write_case` given as
    ``objects`` (probabilities, prediction, uncertainty, masks, names). Written under ``<case>.partial`` and renamed
    when complete; the files written."""
    partial, final = Path(out) / f"{case}.partial", Path(out) / case
    shutil.rmtree(partial, ignore_errors=True)
    try:
        series = source_series(image, affine, shape, outputs, partial, case)
        written = write_case(partial, case, series, tuple(shape[:3]), class_names, **objects)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return [final / p.relative_to(partial) for p in written]


def export_case(folder: Path, summary: dict, case: str, out: Path, images: Path | None = None,
                image: Path | None = None) -> list[Path]:
    """Write ``out/<case>/`` (module docstring) for ``case`` of the evaluation in ``folder``, its image the file
    ``image`` or found in ``images`` (a DICOM series there first), else where :func:`case_files` looks; the files
    written."""
    files = case_files(folder, summary, case, images=images)
    files.image = Path(image) if image is not None else \
        ((find_image([images], case) if images else None) or files.image)
    if files.image is None:
        raise DicomError(f"case {case}: no image found (give --images <folder of {case}.nii.gz, "
                         f"{case}_0000.nii.gz or a DICOM series {case}/>): the DICOM objects reference the image's "
                         f"series")
    if files.prediction is None and files.probabilities is None:
        raise DicomError(f"case {case}: no prediction or probabilities in {folder / 'predictions'}")
    reference = files.prediction or files.probabilities
    reference_array, output_affine = _read(reference)
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
    return write_case_folder(out, case, files.image, output_affine, reference_array.shape[:3], str(reference),
                             classes, probabilities=probabilities, prediction=prediction, uncertainty=uncertainty,
                             masks=masks, names=names)


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

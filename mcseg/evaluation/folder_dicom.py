"""``--dicom`` of ``mcseg-calibrate-folder`` and ``mcseg-conformal-folder``: their outputs as DICOM for clinical
viewers, per case under ``OUT_DIR/dicom/<case>/`` (:func:`mcseg.evaluation.dicom_cases.write_case_folder`).

* calibrate: the calibrated probabilities, read back from the written folder with the tool's own reader on the
  case's grid (its label in the reference, else its image in ``--images``), as a FRACTIONAL / PROBABILITY
  Segmentation (``<case>_probabilities.dcm``, one segment per foreground class or per region) and the arg-max (or,
  for regions, p > 0.5) as a BINARY Segmentation (``<case>_prediction.dcm``);
* conformal: the written ``sure`` and ``possible`` masks as BINARY Segmentations (``<case>_sure.dcm``,
  ``<case>_possible.dcm``), one segment per class of the fit.

Each references the case's image series: found in ``--images``, else in the reference's ``imagesTr``/``imagesTs``
(:func:`mcseg.evaluation.dicom_source.find_image`), a DICOM series referenced as it is, a NIfTI image written as one;
an image whose grid differs from the outputs' is refused naming both. A case's folder appears complete or not at all.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mcseg.data.reference import FolderError, Reference
from mcseg.evaluation.case_files import IMAGE_FOLDERS
from mcseg.evaluation.dicom_cases import DICOM_DIR, write_case_folder
from mcseg.evaluation.dicom_source import find_image

__all__ = ["calibrated_to_dicom", "conformal_to_dicom"]


def _image(case: str, images: Path | None, reference: Reference) -> Path:
    folders = ([images] if images else []) + [Path(reference.root) / d for d in IMAGE_FOLDERS]
    found = find_image(folders, case)
    if found is None:
        raise FolderError(f"--dicom: no image of case {case} in {', '.join(map(str, folders))} (a DICOM series "
                          f"{case}/, or {case}_0000.nii.gz / {case}.nii.gz): pass --images; the DICOM objects "
                          f"reference the image's series")
    return found


def calibrated_to_dicom(out: Path, calibrated, reference: Reference, images: Path | None) -> list[Path]:
    """Every case of the calibrated folder ``calibrated`` (a :class:`~mcseg.evaluation.formats.PredictionFormat`
    of ``out``) as DICOM (module docstring); the files written."""
    from mcseg.evaluation.folders import read_case, read_unlabelled

    task, written = reference.task, []
    for case in calibrated.cases():
        if case in reference.labels:
            grid, _, probs, _, files = read_case([calibrated], reference, case)
        else:
            if images is None:
                raise FolderError(f"--dicom: case {case} has no label in {reference.root}: pass --images (its "
                                  f"image gives the grid and the series)")
            grid, _, probs, _, files = read_unlabelled(calibrated, case, images)
        if probs is None:
            raise FolderError(f"--dicom: case {case}: {calibrated.path} has no probabilities")
        p = np.moveaxis(probs.numpy().astype(np.float32), 0, -1)
        if task.multilabel:  # regions: no background channel, which write_case leaves out; one of zeros in front
            classes = ["(no region)", *task.class_names]
            prediction = np.argmax(np.concatenate([np.full(p.shape[:-1] + (1,), 0.5, np.float32), p], -1), -1)
            p = np.concatenate([np.zeros(p.shape[:-1] + (1,), np.float32), p], -1)
        else:
            classes, prediction = list(task.class_names), np.argmax(p, -1)
        source = [f for f in files if Path(f).parent.resolve() == Path(out).resolve()] or files
        written += write_case_folder(out / DICOM_DIR, case, _image(case, images, reference), grid.affine,
                                     p.shape[:3], str(source[-1]), classes, probabilities=p, prediction=prediction,
                                     names={"probabilities": str(source[-1]), "prediction": str(source[-1])})
    return written


def conformal_to_dicom(out: Path, record: dict, reference: Reference, images: Path | None) -> list[Path]:
    """Every applied case's sure and possible masks written in ``out`` (``record``: conformal.json) as DICOM
    (module docstring); the files written."""
    import nibabel as nib

    applied = record.get("applied") or {}
    classes, written = list(record["classes"]), []
    for case in applied.get("cases") or []:
        masks, names, affine, shape = {}, {}, None, None
        for kind in ("sure", "possible"):
            paths = [out / f for f in applied["files"] if f.startswith(f"{case}_{kind}_") and f.endswith(".nii.gz")]
            if len(paths) != len(classes):
                raise FolderError(f"--dicom: {out}: {len(paths)} {kind} mask(s) of case {case}, expected one per "
                                  f"class ({', '.join(classes)})")
            images_read = [nib.load(str(p)) for p in paths]
            masks[kind] = [np.asanyarray(i.dataobj) > 0 for i in images_read]
            names[kind] = str(paths[0])
            affine, shape = images_read[0].affine, images_read[0].shape
        written += write_case_folder(out / DICOM_DIR, case, _image(case, images, reference), affine, shape,
                                     names["sure"], ["background", *classes], masks=masks, names=names)
    return written

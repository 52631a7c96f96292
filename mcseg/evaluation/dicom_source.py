"""The source image that a case's DICOM objects reference: a DICOM series as it is, or a NIfTI image turned into one.

A case's image is looked for (:func:`find_image`) in the given folders as a DICOM series, a sub-folder ``<case>/``
or ``<case>_0000/`` holding ``.dcm`` files, else as NIfTI ``<case>_0000.nii.gz`` / ``<case>.nii.gz``.

A DICOM series is referenced as it is (:func:`read_series`): its instances sorted along the slice normal
(ImageOrientationPatient's row x column) by ImagePositionPatient, one SeriesInstanceUID, one orientation and pixel
spacing, evenly spaced slices; its grid in NIfTI voxel order is ``Columns x Rows x slices`` and its affine is
:func:`mcseg.evaluation.dicom.series_affine` of the sorted instances (LPS turned to RAS). No new series is written:
the Segmentations carry the series' Study, Series and SOP Instance UIDs.

:func:`source_series` checks the image against the outputs' grid (shape and affine, 1e-3 mm) and refuses one that
differs, naming the image's file or folder and the outputs' file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mcseg.evaluation.dicom import DicomError, dicom_modules, series_affine, write_series

NIFTI_SUFFIXES = (".nii.gz", ".nii")


def is_series(path: Path) -> bool:
    """A folder holding ``.dcm`` files."""
    return Path(path).is_dir() and any(Path(path).glob("*.dcm"))


def find_image(folders: list[Path], case: str) -> Path | None:
    """The case's image in the first of ``folders`` that has it (module docstring); None when none does."""
    for folder in folders:
        for name in (case, f"{case}_0000"):
            if is_series(Path(folder) / name):
                return Path(folder) / name
            for suffix in NIFTI_SUFFIXES:
                if (Path(folder) / f"{name}{suffix}").is_file():
                    return Path(folder) / f"{name}{suffix}"
    return None


def read_series(folder: Path) -> tuple[list, np.ndarray, tuple[int, int, int]]:
    """The instances of the DICOM series in ``folder`` sorted along the slice normal, its NIfTI (RAS) affine and
    its grid (``Columns x Rows x slices``); refused (naming the folder) unless one evenly spaced series."""
    _, pydicom = dicom_modules()
    paths = sorted(Path(folder).glob("*.dcm"))
    instances = [pydicom.dcmread(str(p)) for p in paths]
    if not instances or any("ImagePositionPatient" not in d or "ImageOrientationPatient" not in d for d in instances):
        raise DicomError(f"{folder}: expected a DICOM image series (instances with ImagePositionPatient and "
                         f"ImageOrientationPatient)")
    series = {str(d.SeriesInstanceUID) for d in instances}
    if len(series) > 1:
        raise DicomError(f"{folder}: holds {len(series)} series ({', '.join(sorted(series))}); expected one")
    orientation = np.asarray(instances[0].ImageOrientationPatient, float)
    if any(not np.allclose(np.asarray(d.ImageOrientationPatient, float), orientation, atol=1e-4) or
           [float(v) for v in d.PixelSpacing] != [float(v) for v in instances[0].PixelSpacing] or
           (d.Rows, d.Columns) != (instances[0].Rows, instances[0].Columns) for d in instances):
        raise DicomError(f"{folder}: its instances differ in orientation, pixel spacing or size; expected one grid")
    normal = np.cross(orientation[:3], orientation[3:])
    instances.sort(key=lambda d: float(np.asarray(d.ImagePositionPatient, float) @ normal))
    positions = np.array([np.asarray(d.ImagePositionPatient, float) for d in instances])
    steps = np.diff(positions, axis=0)
    if len(steps) and (not np.allclose(steps, steps[0], atol=1e-3) or np.linalg.norm(steps[0]) < 1e-6):
        raise DicomError(f"{folder}: its slices are not evenly spaced (or two share a position); a Segmentation "
                         f"on the NIfTI outputs' grid needs an evenly spaced series")
    first = instances[0]
    return instances, series_affine(instances), (int(first.Columns), int(first.Rows), len(instances))


def _read_nifti(path: Path):
    import nibabel as nib

    img = nib.load(str(path))
    array = np.asanyarray(img.dataobj)
    return (array[..., 0] if array.ndim == 4 else array), img.affine


def source_series(image: Path, affine: np.ndarray, shape: tuple[int, ...], outputs: str, folder: Path,
                  case: str) -> list:
    """The series the case's objects reference: ``image``'s own when it is a DICOM series, else the NIfTI image
    written as one into ``folder`` (:func:`mcseg.evaluation.dicom.write_series`); refused when its grid or affine
    differs from the outputs' (``affine``, ``shape``; ``outputs`` names their file)."""
    if is_series(image):
        instances, own, grid = read_series(image)
        array = None
    else:
        array, own = _read_nifti(image)
        grid = tuple(array.shape[:3]) if array.ndim >= 3 else (*array.shape, 1)
    if tuple(grid) != tuple(shape[:3]):
        raise DicomError(f"{image}: its grid {tuple(grid)} differs from that of {outputs} {tuple(shape[:3])} (the "
                         f"outputs are not on the image's grid)")
    if not np.allclose(own, affine, atol=1e-3):
        raise DicomError(f"{image}: its affine differs from that of {outputs} (the outputs are not on the image's "
                         f"grid):\n{np.round(own, 4)}\nagainst\n{np.round(np.asarray(affine), 4)}")
    return instances if array is None else write_series(array, own, folder / "series", case, str(image))

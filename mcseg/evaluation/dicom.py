"""A case's outputs as DICOM for clinical viewers (OHIF, 3D Slicer), written with highdicom (pinned) and pydicom.

From NIfTI inputs a DICOM series of the image is written first (:func:`write_series`): one MR Image Storage
instance per slice of the last voxel axis, the geometry from the NIfTI affine (RAS) turned to DICOM's LPS
(x and y negated): ImageOrientationPatient the unit first two columns of the affine, PixelSpacing their lengths
(rows: the second axis, columns: the first), ImagePositionPatient of slice k the affine applied to (0, 0, k); the
intensities stored as 16-bit integers with a rescale slope and intercept (exact for integer images in range,
else quantised to 1/65535 of the image's range). An affine whose third axis is not orthogonal to the first two
(a sheared grid) has no DICOM series and is refused, naming the file.

Referencing that series (:func:`write_case`):
- ``<case>_probabilities.dcm``: a Segmentation, type FRACTIONAL / PROBABILITY, one segment per foreground class,
  8-bit (max fractional value 255: each probability stored to within 1/510, read back within 1/255);
- ``<case>_prediction.dcm`` and ``<case>_sure.dcm`` / ``<case>_possible.dcm``: BINARY Segmentations, one segment per
  class (the conformal masks where given);
- ``<case>_uncertainty.dcm``: a Parametric Map of the uncertainty (float, the predictive entropy in nats, unit
  "no units").
Every file is written to a temporary name and renamed: nothing half-written is left.
"""
from __future__ import annotations

import datetime
import logging
from pathlib import Path

import numpy as np

from mcseg.files import atomic_write

LPS = np.diag([-1.0, -1.0, 1.0])
SEGMENTATION_STORAGE = "1.2.840.10008.5.1.4.1.1.66.4"
MANUFACTURER = dict(manufacturer="mcseg", manufacturer_model_name="mcseg", device_serial_number="0")


class DicomError(ValueError):
    """A grid DICOM cannot hold, or outputs on another grid than the source series; the message names the file."""


def dicom_modules():
    try:
        import highdicom
        import pydicom
    except ImportError as exc:
        raise DicomError(f"DICOM outputs need highdicom and pydicom ({exc}): pip install 'mcseg[dicom]'") from exc
    logging.getLogger("highdicom").setLevel(logging.WARNING)  # a line per module copied, per object, otherwise
    return highdicom, pydicom


def geometry(affine: np.ndarray, where: str = "image") -> dict:
    """Orientation, spacing and slice positions in LPS of a NIfTI ``affine``; refused when sheared."""
    matrix = LPS @ np.asarray(affine, dtype=np.float64)[:3, :3]
    spacing = np.linalg.norm(matrix, axis=0)
    units = matrix / spacing
    if abs(units[:, 0] @ units[:, 2]) > 1e-4 or abs(units[:, 1] @ units[:, 2]) > 1e-4 \
            or abs(units[:, 0] @ units[:, 1]) > 1e-4:
        raise DicomError(f"{where}: its affine's axes are not orthogonal (a sheared grid): a DICOM series cannot "
                         "hold it")
    return {"row": units[:, 0], "column": units[:, 1], "spacing": spacing, "origin": LPS @ np.asarray(affine)[:3, 3],
            "step": matrix[:, 2]}


def write_series(image: np.ndarray, affine: np.ndarray, folder: Path, case: str, where: str = "image") -> list:
    """The image (``X x Y x Z``, NIfTI voxel order) as a DICOM MR series in ``folder`` (module docstring);
    returns its datasets, slice k first."""
    highdicom, pydicom = dicom_modules()
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

    grid = geometry(affine, where)
    image = np.asarray(image, dtype=np.float64)
    image = image[..., None] if image.ndim == 2 else image
    lo, hi = float(image.min()), float(image.max())
    integral = np.all(np.equal(np.mod(image, 1), 0)) and lo >= -32768 and hi <= 32767
    slope, intercept = (1.0, 0.0) if integral else (max(hi - lo, 1e-12) / 65535.0, lo)
    stored = np.rint((image - intercept) / slope).astype(np.int16 if integral else np.uint16)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    now = datetime.datetime.now()
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(image.shape[2]):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = MRImageStorage, generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = MRImageStorage, meta.MediaStorageSOPInstanceUID
        ds.PatientName, ds.PatientID, ds.PatientBirthDate, ds.PatientSex = f"{case}^", case, "", ""
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.StudyDate, ds.StudyTime = now.strftime("%Y%m%d"), now.strftime("%H%M%S")
        ds.StudyID, ds.AccessionNumber, ds.ReferringPhysicianName = "1", "", ""
        ds.Modality, ds.SeriesNumber, ds.InstanceNumber = "MR", 1, k + 1
        ds.SeriesDescription = f"{case} (from NIfTI by mcseg)"
        ds.Manufacturer = "mcseg"
        ds.ImageType = ["DERIVED", "SECONDARY"]
        ds.ImageOrientationPatient = [float(v) for v in (*grid["row"], *grid["column"])]
        ds.ImagePositionPatient = [float(v) for v in grid["origin"] + k * grid["step"]]
        ds.PixelSpacing = [float(grid["spacing"][1]), float(grid["spacing"][0])]
        ds.SliceThickness = float(grid["spacing"][2])
        ds.Rows, ds.Columns = image.shape[1], image.shape[0]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
        ds.PixelRepresentation = 1 if integral else 0
        ds.RescaleSlope, ds.RescaleIntercept = f"{slope:.10g}"[:16], f"{intercept:.10g}"[:16]
        ds.PixelData = np.ascontiguousarray(stored[:, :, k].T).tobytes()
        path = folder / f"{k + 1:04d}.dcm"
        atomic_write(path, lambda tmp, ds=ds: ds.save_as(tmp, enforce_file_format=True))
        out.append(ds)
    return out


def frames(volume: np.ndarray) -> np.ndarray:
    """``X x Y x Z [x C]`` (NIfTI voxel order) as ``Z x rows x columns [x C]`` frames of the series."""
    volume = np.asarray(volume)
    return np.moveaxis(volume, (0, 1, 2), (2, 1, 0))


def _segments(names: list[str]) -> list:
    highdicom, _ = dicom_modules()
    from pydicom.sr.codedict import codes

    algorithm = highdicom.AlgorithmIdentificationSequence(name="mcseg", version="0.1",
                                                          family=codes.DCM.ArtificialIntelligence)
    return [highdicom.seg.SegmentDescription(
        segment_number=i, segment_label=name[:64], segmented_property_category=codes.SCT.Tissue,
        segmented_property_type=codes.SCT.AnatomicalStructure,
        algorithm_type=highdicom.seg.SegmentAlgorithmTypeValues.AUTOMATIC, algorithm_identification=algorithm)
        for i, name in enumerate(names, start=1)]


def _check(array: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if tuple(array.shape[:3]) != tuple(shape):
        raise DicomError(f"{what}: grid {tuple(array.shape[:3])} differs from the source series' {tuple(shape)}")


def write_case(folder: Path, case: str, series: list, shape: tuple[int, ...], class_names: list[str],
               probabilities: np.ndarray | None = None, prediction: np.ndarray | None = None,
               uncertainty: np.ndarray | None = None, masks: dict[str, list[np.ndarray]] | None = None,
               names: dict[str, str] | None = None) -> list[Path]:
    """The case's DICOM objects (module docstring) referencing ``series`` (of grid ``shape``) in ``folder``:
    ``probabilities`` ``X x Y x Z x K`` (channel 0 the background, left out), ``prediction`` a label map,
    ``uncertainty`` a float map, ``masks`` {"sure"/"possible": one mask per foreground class}; ``names``: which
    file each came from, for the messages. Returns the paths written."""
    highdicom, pydicom = dicom_modules()
    from pydicom.uid import generate_uid

    names = names or {}
    foreground = list(class_names[1:])
    objects = {}
    common = dict(series_number=100, instance_number=1, software_versions="mcseg", **MANUFACTURER)
    if probabilities is not None:
        _check(probabilities, shape, names.get("probabilities", "probabilities"))
        fractional = frames(np.clip(probabilities[..., 1:], 0, 1).astype(np.float32))
        objects["probabilities"] = highdicom.seg.Segmentation(
            series, fractional, highdicom.seg.SegmentationTypeValues.FRACTIONAL, _segments(foreground),
            generate_uid(), sop_instance_uid=generate_uid(), max_fractional_value=255, omit_empty_frames=False,
            fractional_type=highdicom.seg.SegmentationFractionalTypeValues.PROBABILITY,
            series_description=f"{case} probabilities", **common)
    binary = {}
    if prediction is not None:
        _check(prediction, shape, names.get("prediction", "prediction"))
        binary["prediction"] = [prediction == k for k in range(1, len(class_names))]
    for kind, found in (masks or {}).items():
        for mask in found:
            _check(mask, shape, names.get(kind, kind))
        binary[kind] = [m > 0 for m in found]
    for kind, found in binary.items():
        objects[kind] = highdicom.seg.Segmentation(
            series, frames(np.stack(found, -1).astype(np.uint8)), highdicom.seg.SegmentationTypeValues.BINARY,
            _segments(foreground[:len(found)]), generate_uid(), sop_instance_uid=generate_uid(),
            omit_empty_frames=False, series_description=f"{case} {kind}", **common)
    if uncertainty is not None:
        _check(uncertainty, shape, names.get("uncertainty", "uncertainty"))
        values = frames(uncertainty.astype(np.float32))
        mapping = highdicom.pm.RealWorldValueMapping(
            lut_label="entropy", lut_explanation="predictive entropy (nats)",
            unit=highdicom.sr.CodedConcept("1", "UCUM", "no units"),
            value_range=(float(values.min()), float(values.max())), slope=1, intercept=0)
        objects["uncertainty"] = highdicom.pm.ParametricMap(
            series, values, generate_uid(), sop_instance_uid=generate_uid(),
            contains_recognizable_visual_features=False, real_world_value_mappings=[mapping],
            voi_lut_transformations=[highdicom.VOILUTTransformation(
                window_center=float(values.max()) / 2, window_width=max(float(values.max()), 1e-6))],
            series_description=f"{case} uncertainty", **common)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, dataset in objects.items():
        path = folder / f"{case}_{kind}.dcm"
        atomic_write(path, lambda tmp, d=dataset: d.save_as(tmp, enforce_file_format=True))
        written.append(path)
    return written


def read_frames(path: Path, series: list) -> np.ndarray:
    """A Segmentation (``X x Y x Z x segments``, fractional ones rescaled to [0, 1]) or a Parametric Map
    (``X x Y x Z``) of ``path`` back on the NIfTI grid of ``series``, frames matched to slices by position."""
    highdicom, pydicom = dicom_modules()
    dataset = pydicom.dcmread(str(path))
    positions = [np.asarray(s.ImagePositionPatient, float) for s in series]
    if dataset.SOPClassUID == SEGMENTATION_STORAGE:
        seg = highdicom.seg.Segmentation.from_dataset(dataset)
        return frames(seg.get_pixels_by_source_instance([s.SOPInstanceUID for s in series], combine_segments=False,
                                                        rescale_fractional=True))
    order = [next(k for k, p in enumerate(positions) if np.allclose(
        p, np.asarray(f.PlanePositionSequence[0].ImagePositionPatient, float), atol=1e-3))
        for f in dataset.PerFrameFunctionalGroupsSequence]
    pixels = dataset.pixel_array.astype(np.float32)
    pixels = pixels[None] if pixels.ndim == 2 else pixels
    out = np.empty((len(series), *pixels.shape[1:]), np.float32)
    out[order] = pixels
    return frames(out)


def series_affine(series: list) -> np.ndarray:
    """The NIfTI (RAS) affine of a series written by :func:`write_series` (its first slice's position, the
    orientation, spacing and the step between slices), for the round trip's geometry check."""
    first = series[0]
    orientation = np.asarray(first.ImageOrientationPatient, float)
    row, column = orientation[:3], orientation[3:]
    dy, dx = (float(v) for v in first.PixelSpacing)
    origin = np.asarray(first.ImagePositionPatient, float)
    step = (np.asarray(series[1].ImagePositionPatient, float) - origin if len(series) > 1
            else np.cross(row, column) * float(first.SliceThickness))
    affine = np.eye(4)
    affine[:3, :3] = LPS @ np.stack([row * dx, column * dy, step], 1)
    affine[:3, 3] = LPS @ origin
    return affine

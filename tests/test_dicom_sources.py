"""DICOM inputs referenced as they are (mcseg/evaluation/dicom_source.py): a case whose image is a DICOM series
(written here with pydicom, instances in shuffled order) gets Segmentations that carry that series' Study, Series and
SOP Instance UIDs, with no second series written; a series whose geometry differs from the prediction is refused
naming its folder, leaving nothing. And, where dcmqi installs, its segimage2itkimage reads the fractional
Segmentation back on the same grid."""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from tests.conftest import require

require("highdicom", "it writes the DICOM objects under test")
pydicom = require("pydicom", "it writes the source series and reads the objects back")

from mcseg.evaluation import dicom  # noqa: E402
from mcseg.evaluation.dicom_cases import export_case  # noqa: E402
from mcseg.evaluation.dicom_source import read_series  # noqa: E402

SHAPE = (6, 5, 4)  # NIfTI order: columns, rows, slices
SPACING = (0.8, 0.7, 2.5)  # column, row, slice spacing in mm
ORIGIN_LPS = np.array([-10.0, 20.0, 5.0])


def write_ct_series(folder, values: np.ndarray) -> list[str]:
    """An axial CT series of ``values`` (``SHAPE``, NIfTI order) with pydicom alone, files in shuffled order;
    the SOP Instance UIDs, slice 0 first."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    folder.mkdir(parents=True)
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    uids = []
    for k, name in zip(range(SHAPE[2]), (3, 0, 2, 1)):
        ds = Dataset()
        ds.file_meta = FileMetaDataset()
        ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = CTImageStorage, generate_uid()
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, ds.file_meta.MediaStorageSOPInstanceUID
        ds.PatientName, ds.PatientID, ds.PatientBirthDate, ds.PatientSex = "test^", "p1", "", ""
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.StudyDate, ds.StudyTime, ds.StudyID, ds.AccessionNumber, ds.ReferringPhysicianName = \
            "20260101", "120000", "1", "", ""
        ds.Modality, ds.SeriesNumber, ds.InstanceNumber, ds.Manufacturer = "CT", 3, k + 1, "test"
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.ImagePositionPatient = [float(v) for v in ORIGIN_LPS + [0, 0, k * SPACING[2]]]
        ds.PixelSpacing, ds.SliceThickness = [SPACING[1], SPACING[0]], SPACING[2]
        ds.Rows, ds.Columns = SHAPE[1], SHAPE[0]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleSlope, ds.RescaleIntercept = 1, 0
        ds.PixelData = np.ascontiguousarray(values[:, :, k].T.astype(np.int16)).tobytes()
        ds.save_as(str(folder / f"IM{name}.dcm"), enforce_file_format=True)
        uids.append(ds.SOPInstanceUID)
    return uids


def _affine(spacing=SPACING):
    """The NIfTI (RAS) affine of the series: LPS x and y negated."""
    return np.array([[-spacing[0], 0, 0, -ORIGIN_LPS[0]], [0, -spacing[1], 0, -ORIGIN_LPS[1]],
                     [0, 0, spacing[2], ORIGIN_LPS[2]], [0, 0, 0, 1.0]])


def _evaluation(tmp_path, affine):
    """An evaluation folder of one case: its prediction and probabilities as NIfTI on ``affine``."""
    from mcseg.data.io import write_nifti

    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1, 1, 1], size=SHAPE).astype(np.float32)
    folder = tmp_path / "eval"
    (folder / "predictions").mkdir(parents=True)
    write_nifti(folder / "predictions" / "c0_probs.nii.gz", probs, affine)
    write_nifti(folder / "predictions" / "c0.nii.gz", probs.argmax(-1).astype(np.uint8), affine)
    return folder, probs


def test_a_dicom_source_series_is_referenced_as_it_is(tmp_path):
    uids = write_ct_series(tmp_path / "images" / "c0", np.arange(np.prod(SHAPE)).reshape(SHAPE) % 200)
    folder, probs = _evaluation(tmp_path, _affine())
    written = export_case(folder, {"classes": ["a", "b"]}, "c0", tmp_path / "out", tmp_path / "images")
    case = tmp_path / "out" / "c0"
    assert {p.name for p in written} == {"c0_probabilities.dcm", "c0_prediction.dcm"}
    assert not (case / "series").exists()  # no second series: the source one is referenced
    source = pydicom.dcmread(str(tmp_path / "images" / "c0" / "IM0.dcm"))
    series, affine, shape = read_series(tmp_path / "images" / "c0")
    assert [s.SOPInstanceUID for s in series] == uids and shape == SHAPE and np.allclose(affine, _affine())
    for path in written:
        seg = pydicom.dcmread(str(path))
        assert seg.StudyInstanceUID == source.StudyInstanceUID
        assert seg.FrameOfReferenceUID == source.FrameOfReferenceUID
        (referenced,) = seg.ReferencedSeriesSequence
        assert referenced.SeriesInstanceUID == source.SeriesInstanceUID
        assert {i.ReferencedSOPInstanceUID for i in referenced.ReferencedInstanceSequence} == set(uids)
    assert np.abs(dicom.read_frames(case / "c0_probabilities.dcm", series) - probs[..., 1:]).max() <= 1 / 255
    assert (dicom.read_frames(case / "c0_prediction.dcm", series)
            == np.stack([probs.argmax(-1) == k for k in (1, 2)], -1)).all()


def test_a_dicom_source_on_another_grid_is_refused_naming_it_leaving_nothing(tmp_path):
    write_ct_series(tmp_path / "images" / "c0", np.zeros(SHAPE))
    folder, _ = _evaluation(tmp_path, _affine((0.8, 0.7, 3.0)))  # other slice spacing than the series'
    with pytest.raises(dicom.DicomError, match=r"images/c0: its affine differs from that of .*c0.nii.gz"):
        export_case(folder, {"classes": ["a", "b"]}, "c0", tmp_path / "out", tmp_path / "images")
    assert not any((tmp_path / "out").glob("c0*"))


def test_mcseg_dicom_refuses_an_output_folder_that_cannot_be_written_naming_it(tmp_path, capsys):
    from mcseg.dicom_export import main as dicom_main

    folder, _ = _evaluation(tmp_path, _affine())
    (folder / "summary.json").write_text("{}")
    (tmp_path / "a_file").write_text("")
    assert dicom_main([str(folder), "--cases", "c0", "--out", str(tmp_path / "a_file" / "dcm")]) == 1
    assert f"--out {tmp_path / 'a_file' / 'dcm'}: the output folder cannot be written" in capsys.readouterr().err


def _segimage2itkimage() -> str:
    found = os.environ.get("MCSEG_SEGIMAGE2ITKIMAGE") or shutil.which("segimage2itkimage")
    if not found:
        pytest.skip("dcmqi's segimage2itkimage not found (pip install 'mcseg[dcmqi]' or dcmqi==1.5.7 into any "
                    "environment and put its bin/ on PATH, or set MCSEG_SEGIMAGE2ITKIMAGE)")
    return found


def test_dcmqi_reads_the_fractional_segmentation_back_on_the_same_grid(tmp_path):
    """dcmqi's segimage2itkimage (an independent reader, C++ on DCMTK and ITK) turns the probabilities' FRACTIONAL
    Segmentation into NIfTI: per segment within 1/255 of the probabilities, on the affine of the source series."""
    import nibabel as nib

    tool = _segimage2itkimage()
    write_ct_series(tmp_path / "images" / "c0", np.zeros(SHAPE))
    folder, probs = _evaluation(tmp_path, _affine())
    export_case(folder, {"classes": ["a", "b"]}, "c0", tmp_path / "out", tmp_path / "images")
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run([tool, "--inputDICOM", str(tmp_path / "out" / "c0" / "c0_probabilities.dcm"), "--outputDirectory",
                    str(back), "--outputType", "nifti"], check=True, capture_output=True, timeout=120)
    for k in (1, 2):
        img = nib.load(str(back / f"{k}.nii.gz"))
        assert np.allclose(img.affine, _affine(), atol=1e-3)
        values = np.asarray(img.dataobj, np.float64)
        values = values / 255 if values.max() > 1 else values
        assert values.shape == SHAPE and np.abs(values - probs[..., k]).max() <= 1 / 255

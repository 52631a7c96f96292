"""DICOM for clinical viewers (mcseg/evaluation/dicom.py, mcseg-dicom): the image as a series with the NIfTI
affine's geometry, the probabilities as a FRACTIONAL / PROBABILITY Segmentation read back within 1/255, the
prediction and conformal masks as BINARY Segmentations read back exactly, the uncertainty as a Parametric Map,
all on the series' grid; a grid DICOM cannot hold, or outputs on another grid than the image, refused naming the
file, with nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import require
from tests.report_runs import report_runs

require("highdicom", "it writes the DICOM objects under test")
pydicom = require("pydicom", "it reads the DICOM objects back")

from mcseg.dicom_export import main as dicom_main  # noqa: E402
from mcseg.evaluation import dicom  # noqa: E402

OBLIQUE = np.array([[0.0, -1.2, 0.0, 10.0], [0.9, 0.0, 0.0, -5.0], [0.0, 0.0, 2.5, 3.0], [0.0, 0.0, 0.0, 1.0]])


def _series(folder):
    return [pydicom.dcmread(str(p)) for p in sorted(folder.glob("*.dcm"))]


def test_a_case_round_trips_on_the_same_geometry(tmp_path):
    rng = np.random.default_rng(0)
    shape = (7, 6, 4)
    probs = rng.dirichlet([1, 1, 1], size=shape).astype(np.float32)
    pred, entropy = probs.argmax(-1), -(probs * np.log(probs)).sum(-1)
    image = rng.normal(100, 20, shape).astype(np.float32)
    series = dicom.write_series(image, OBLIQUE, tmp_path / "series", "c0")
    written = dicom.write_case(tmp_path, "c0", series, shape, ["bg", "a", "b"], probs, pred, entropy,
                               {"possible": [pred >= 1, pred == 2]})
    assert sorted(p.name for p in written) == ["c0_possible.dcm", "c0_prediction.dcm", "c0_probabilities.dcm",
                                               "c0_uncertainty.dcm"]
    series = _series(tmp_path / "series")
    assert np.allclose(dicom.series_affine(series), OBLIQUE)
    back = np.stack([s.pixel_array * float(s.RescaleSlope) + float(s.RescaleIntercept) for s in series], -1)
    assert np.abs(back.transpose(1, 0, 2) - image).max() <= (image.max() - image.min()) / 65535 + 1e-4
    fractional = pydicom.dcmread(str(tmp_path / "c0_probabilities.dcm"))
    assert (fractional.SegmentationType, fractional.SegmentationFractionalType) == ("FRACTIONAL", "PROBABILITY")
    assert fractional.ReferencedSeriesSequence[0].SeriesInstanceUID == series[0].SeriesInstanceUID
    assert np.abs(dicom.read_frames(tmp_path / "c0_probabilities.dcm", series) - probs[..., 1:]).max() <= 1 / 255
    binary = dicom.read_frames(tmp_path / "c0_prediction.dcm", series)
    assert pydicom.dcmread(str(tmp_path / "c0_prediction.dcm")).SegmentationType == "BINARY"
    assert (binary == np.stack([pred == 1, pred == 2], -1)).all()
    assert (dicom.read_frames(tmp_path / "c0_possible.dcm", series) == np.stack([pred >= 1, pred == 2], -1)).all()
    assert np.allclose(dicom.read_frames(tmp_path / "c0_uncertainty.dcm", series), entropy, atol=1e-6)


def test_a_sheared_grid_is_refused_naming_the_file(tmp_path):
    sheared = OBLIQUE.copy()
    sheared[0, 2] = 1.0
    with pytest.raises(dicom.DicomError, match="scan.nii.gz: its affine's axes are not orthogonal"):
        dicom.write_series(np.zeros((3, 3, 3)), sheared, tmp_path / "series", "c0", "scan.nii.gz")


@pytest.mark.slow
def test_mcseg_dicom_exports_an_evaluation_and_refuses_another_grid_leaving_nothing(tmp_path, capsys):
    from mcseg.data.io import write_nifti

    runs = report_runs(tmp_path)
    evaluation = runs / "ce0" / "eval" / "test"
    assert dicom_main([str(evaluation), "--cases", "c1", "--out", str(tmp_path / "dcm")]) == 0
    case = tmp_path / "dcm" / "c1"
    assert {p.name for p in case.glob("*.dcm")} == {"c1_probabilities.dcm", "c1_prediction.dcm", "c1_sure.dcm",
                                                   "c1_possible.dcm", "c1_uncertainty.dcm"}
    series = _series(case / "series")
    probs = np.asarray(__import__("nibabel").load(str(evaluation / "predictions" / "c1_probs.nii.gz")).dataobj)
    assert np.abs(dicom.read_frames(case / "c1_probabilities.dcm", series) - probs[..., 1:]).max() <= 1 / 255
    assert np.allclose(dicom.series_affine(series), np.diag([1, 1, 2.5, 1]))
    # an image on another grid than the outputs: refused, naming both files, and no folder of the case left
    images = tmp_path / "moved"
    images.mkdir()
    write_nifti(images / "c2.nii.gz", np.zeros((20, 16, 8), np.float32), np.diag([1, 1, 3.0, 1]))
    assert dicom_main([str(evaluation), "--cases", "c2", "--images", str(images), "--out", str(tmp_path / "dcm")]) == 1
    err = capsys.readouterr().err
    assert "moved/c2.nii.gz: its affine differs from that of" in err and "c2.nii.gz" in err
    assert not (tmp_path / "dcm" / "c2").exists() and not (tmp_path / "dcm" / "c2.partial").exists()
    assert json.loads((evaluation / "summary.json").read_text())["classes"] == ["a", "b"]


@pytest.mark.slow
def test_save_dicom_exports_every_case_of_an_evaluation_with_the_datasets_images(tmp_path):
    """What evaluate.py save_dicom=true calls after the evaluation: each case with its dataset image file."""
    from mcseg.evaluation.dicom_cases import export_evaluation

    runs = report_runs(tmp_path)
    evaluation = runs / "margin0" / "eval" / "test"
    images = {c: tmp_path / "data" / "imagesTr" / f"{c}_0000.nii.gz" for c in ("c0", "c1", "c2")}
    written = export_evaluation(evaluation, json.loads((evaluation / "summary.json").read_text()), images)
    assert len(written) == 3 * 5 and {p.parent.name for p in written} == {"c0", "c1", "c2"}
    series = _series(evaluation / "dicom" / "c2" / "series")
    assert len(series) == 8 and series[0].SeriesDescription.startswith("c2")


@pytest.mark.slow
def test_evaluate_folder_dicom_writes_each_case_over_the_reference_images(tmp_path, capsys):
    """mcseg-evaluate-folder --dicom: an mcseg prediction folder (label maps and probabilities) evaluated against a
    labels folder, every case then written as DICOM over its image from --images."""
    import shutil

    from mcseg.evaluate_folder import main as evaluate_folder_main

    runs = report_runs(tmp_path)
    predictions = tmp_path / "preds"
    predictions.mkdir()
    for path in (runs / "ce0" / "eval" / "test" / "predictions").glob("*.nii.gz"):
        if not path.name.endswith("_entropy.nii.gz"):
            shutil.copy(path, predictions / path.name)
    data = tmp_path / "data"
    argv = [str(predictions), str(data / "labelsTr"), "--num-classes", "3", "-o", str(tmp_path / "eval"),
            "--bootstrap-samples", "10", "--no-figures", "--dicom", "--images", str(data / "imagesTr")]
    assert evaluate_folder_main(argv) == 0, capsys.readouterr().err
    case = tmp_path / "eval" / "dicom" / "c0"
    assert {p.name for p in case.glob("*.dcm")} == {"c0_probabilities.dcm", "c0_prediction.dcm"}
    probs = np.asarray(__import__("nibabel").load(str(predictions / "c0_probs.nii.gz")).dataobj)
    back = dicom.read_frames(case / "c0_probabilities.dcm", _series(case / "series"))
    assert np.abs(back - probs[..., 1:]).max() <= 1 / 255


@pytest.mark.slow
def test_a_training_with_save_dicom_writes_its_test_cases_on_their_images_geometry(make_cfg, tmp_path, monkeypatch):
    """inference.save_dicom=true: after the run's test evaluation, each test case as DICOM over its own image (an
    MSD folder with a rotated affine), the series' geometry the image's and the probabilities within 1/255."""
    import nibabel as nib

    from mcseg.train import train
    from tests.fake_datasets import write_msd
    from tests.test_bad_input import MSD_TINY

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    root = write_msd(tmp_path / "msd", n_cases=4)
    train(make_cfg(MSD_TINY + [f"dataset.root={root}", "trainer.device=cpu", "inference.save_dicom=true",
                               "inference.save_probabilities=true"]))
    evaluation = tmp_path / "run" / "eval" / "test"
    cases = sorted(p for p in (evaluation / "dicom").iterdir())
    assert cases and all((c / f"{c.name}_probabilities.dcm").is_file() for c in cases)
    case = cases[0]
    series = _series(case / "series")
    image = nib.load(str(next((root / "imagesTr").glob(f"{case.name}*"))))
    assert np.allclose(dicom.series_affine(series), image.affine, atol=1e-4)
    probs = np.asarray(nib.load(str(evaluation / "predictions" / f"{case.name}_probs.nii.gz")).dataobj)
    assert np.abs(dicom.read_frames(case / f"{case.name}_probabilities.dcm", series) - probs[..., 1:]).max() <= 1 / 255

"""``--dicom`` of mcseg-calibrate-folder and mcseg-conformal-folder (mcseg/evaluation/folder_dicom.py) on tiny MONAI SaveImage
folders: the calibrated probabilities as a FRACTIONAL Segmentation within 1/255 of the calibrated files, the
conformal sure / possible masks as BINARY Segmentations equal to the written NIfTI masks, each on its image's
geometry; --dicom without --apply refused before anything is written."""
from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from tests.conftest import require
from tests.tool_outputs import STUDY_AFFINE

pydicom = require("pydicom", "it reads the DICOM objects back")
require("highdicom", "it writes the DICOM objects under test")

from mcseg.calibrate_folder import main as calibrate  # noqa: E402
from mcseg.conformal_folder import main as conformal  # noqa: E402
from mcseg.evaluation import dicom  # noqa: E402

NAMES = ["--class-names", "background", "left", "right"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from tests.tool_outputs import make_monai_study

    return make_monai_study(tmp_path_factory.mktemp("folder_dicom"), n_cases=8, n_fit=6, noise=1.2, name="case_{i}")


def _args(folders, out, *extra):
    return ["--fit", str(folders["fit"]), "--reference", str(folders["labels"]), "-o", str(out), *NAMES, *extra]


def _series(folder):
    return [pydicom.dcmread(str(p)) for p in sorted(folder.glob("*.dcm"))]


def test_dicom_without_apply_is_refused_writing_nothing(tmp_path, capsys):
    assert calibrate(["--fit", str(tmp_path), "--reference", str(tmp_path), "-o", str(tmp_path / "c"), "--dicom",
                      *NAMES]) == 2
    assert conformal(["--fit", str(tmp_path), "--reference", str(tmp_path), "-o", str(tmp_path / "f"), "--dicom",
                      *NAMES]) == 2
    err = capsys.readouterr().err
    assert "--dicom writes the calibrated --apply cases" in err and "--dicom writes the --apply cases' masks" in err
    assert not (tmp_path / "c").exists() and not (tmp_path / "f").exists()


@pytest.mark.slow
def test_calibrated_probabilities_as_a_fractional_segmentation_on_the_images_geometry(folders, tmp_path):
    from mcseg.data.reference import read_reference
    from mcseg.evaluation.folders import read_case
    from mcseg.evaluation.formats import open_folder

    out = tmp_path / "cal"
    assert calibrate(_args(folders, out, "--apply", str(folders["new"]), "--dicom", "--images",
                           str(folders["images"]))) == 0
    reference = read_reference(folders["labels"], ["background", "left", "right"])
    probs = read_case([open_folder(out, reference.task)], reference, "case_6")[2].numpy()
    case = out / "dicom" / "case_6"
    series = _series(case / "series")
    assert np.allclose(dicom.series_affine(series), STUDY_AFFINE, atol=1e-4)
    back = dicom.read_frames(case / "case_6_probabilities.dcm", series)
    assert np.abs(back - np.moveaxis(probs, 0, -1)[..., 1:]).max() <= 1 / 255
    assert (dicom.read_frames(case / "case_6_prediction.dcm", series)
            == np.stack([probs.argmax(0) == k for k in (1, 2)], -1)).all()


@pytest.mark.slow
def test_conformal_masks_as_binary_segmentations_equal_to_the_nifti_masks(folders, tmp_path):
    out = tmp_path / "conf"
    assert conformal(_args(folders, out, "--apply", str(folders["new"]), "--dicom", "--alpha", "0.3",
                           "--repeats", "0", "--images", str(folders["images"]))) == 0
    record = json.loads((out / "conformal.json").read_text())
    assert sorted(record["dicom"]) == sorted(f"dicom/case_{i}/case_{i}_{k}.dcm" for i in (6, 7)
                                             for k in ("sure", "possible"))
    series = _series(out / "dicom" / "case_7" / "series")
    for kind in ("sure", "possible"):
        expected = np.stack([np.asarray(nib.load(str(out / f"case_7_{kind}_{c}.nii.gz")).dataobj) > 0
                             for c in ("left", "right")], -1)
        segmentation = pydicom.dcmread(str(out / "dicom" / "case_7" / f"case_7_{kind}.dcm"))
        assert segmentation.SegmentationType == "BINARY"
        assert [s.SegmentLabel for s in segmentation.SegmentSequence] == ["left", "right"]
        assert (dicom.read_frames(out / "dicom" / "case_7" / f"case_7_{kind}.dcm", series) == expected).all()

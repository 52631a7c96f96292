"""``mcseg-data check``: every kind of broken input is reported per case, with the file named; then a summary."""
from __future__ import annotations

import json
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
from .data_helpers import fake_download

from mcseg.data.check import main


def _rewrite(path, fn, affine=None):
    img = nib.load(str(path))
    data = fn(np.asarray(img.dataobj).copy())
    nib.save(nib.Nifti1Image(data, img.affine if affine is None else affine), str(path))


def _run(capsys, args):
    code = main(["check", *args, "--workers", "1", "--no-progress"])
    out = capsys.readouterr().out
    return code, out


def _lines(out: str, case: str) -> str:
    return "\n".join(line for line in out.splitlines() if f" {case}:" in line)


def test_a_clean_download_passes_with_a_summary(tmp_path, capsys):
    root, overrides = fake_download("acdc", tmp_path)
    code, out = _run(capsys, [f"dataset.root={root}", "dataset=acdc", "--json", str(tmp_path / "report.json")])
    assert code == 0, out
    assert "28 cases, 0 with errors" in out
    assert "ERROR" not in out
    assert "1.5625-1.5625-1.5625 x 1.5625-1.5625-1.5625 x 10-10-10" in out  # spacings (mm) min-median-max
    assert "40-40-40 x 36-36-36 x 6-6-6" in out
    assert "1 RV" in out and "in 28 cases" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["cases"] == 28 and len(report["cases"]) == 28
    assert [c["value"] for c in report["summary"]["classes"]] == [0, 1, 2, 3]


def test_every_broken_case_is_reported_with_its_file(tmp_path, capsys):
    root, overrides = fake_download("acdc", tmp_path)
    p = root / "training"
    (p / "patient001/patient001_frame01_gt.nii.gz").unlink()  # missing label
    es2 = int((p / "patient002/Info.cfg").read_text().split("ES:")[1].split()[0])
    (p / f"patient002/patient002_frame{es2:02d}.nii.gz").unlink()  # missing image
    _rewrite(p / "patient003/patient003_frame01_gt.nii.gz", lambda a: a[:, :-2])  # shape mismatch
    img = nib.load(str(p / "patient004/patient004_frame01_gt.nii.gz"))
    shifted = img.affine.copy()
    shifted[:3, 3] += 4.0
    _rewrite(p / "patient004/patient004_frame01_gt.nii.gz", lambda a: a, affine=shifted)  # affine mismatch
    _rewrite(p / "patient005/patient005_frame01_gt.nii.gz", lambda a: np.where(a == 3, 7, a).astype(np.uint8))
    _rewrite(p / "patient006/patient006_frame01.nii.gz",  # NaN and inf intensities
             lambda a: np.concatenate([[np.nan, np.inf], a.astype(np.float32).ravel()[2:]]).reshape(a.shape))
    _rewrite(p / "patient007/patient007_frame01_gt.nii.gz", lambda a: np.zeros_like(a))  # empty label: a warning
    for name in ("patient008_frame01.nii.gz", "patient008_frame01_gt.nii.gz"):  # 30 mm slices: a spacing outlier
        img = nib.load(str(p / "patient008" / name))
        aff = img.affine.copy()
        aff[:3, 2] *= 3
        nib.save(nib.Nifti1Image(np.asarray(img.dataobj), aff), str(p / "patient008" / name))
    (p / "patient009/Info.cfg").unlink()  # a layout error
    code, out = _run(capsys, ["dataset=acdc", f"dataset.root={root}"])
    assert code == 1
    assert "ERROR" in _lines(out, "patient001_ED") and "patient001_frame01_gt.nii.gz: file not found" in out
    assert f"patient002_frame{es2:02d}.nii.gz: file not found" in _lines(out, "patient002_ES")
    assert "patient003_frame01_gt.nii.gz: label shape (40, 34, 6) does not match image shape (40, 36, 6)" in out
    assert "patient004_frame01_gt.nii.gz: label affine differs" in _lines(out, "patient004_ED")
    assert "patient005_frame01_gt.nii.gz: label values [7] outside [0, 3]" in _lines(out, "patient005_ED")
    assert "patient006_frame01.nii.gz: 1 NaN and 1 inf intensities" in _lines(out, "patient006_ED")
    assert "WARNING patient007_ED" in out and "label map is empty" in _lines(out, "patient007_ED")
    assert "WARNING patient008_ED" in out and "far from the dataset median" in _lines(out, "patient008_ED")
    assert "ERROR   (layout)" in out and "patient009/Info.cfg: file not found" in out
    assert not _lines(out, "patient010_ED")  # untouched cases are quiet
    assert "6 with errors, 2 with warnings only, 1 layout error" in out


def test_channel_mismatches_are_reported(tmp_path, capsys):
    root, overrides = fake_download("nnunet", tmp_path)
    _rewrite(root / "imagesTr/fake_001_0001.nii.gz", lambda a: a[:-1])
    img = nib.load(str(root / "imagesTr/fake_002_0001.nii.gz"))
    aff = img.affine.copy()
    aff[0, 0] *= 1.5
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), aff), str(root / "imagesTr/fake_002_0001.nii.gz"))
    (root / "labelsTr/fake_004.nii.gz").unlink()
    code, out = _run(capsys, overrides)
    assert code == 1
    assert "fake_001_0001.nii.gz: channel shape (27, 24, 12) does not match fake_001_0000.nii.gz" in out
    assert "fake_002_0001.nii.gz: affine differs from that of fake_002_0000.nii.gz" in out
    assert "fake_004.nii.gz: file not found" in _lines(out, "fake_004")


def test_mapped_labels_are_checked_after_the_mapping(tmp_path, capsys):
    root, overrides = fake_download("brats", tmp_path)
    seg = root / "BraTS20_Training_002/BraTS20_Training_002_seg.nii.gz"
    _rewrite(seg, lambda a: np.where(a == 2, 5, a).astype(np.uint8))  # 4 is legal (mapped), 5 is not
    code, out = _run(capsys, overrides)
    assert code == 1
    assert "BraTS20_Training_002_seg.nii.gz: label values [5] outside [0, 3]" in out
    assert "1 with errors" in out


@pytest.mark.parametrize("args,message", [
    (["dataset=acdc"], "dataset.root is not set"),
    (["dataset=acdc", "dataset.root=/no/such/folder"], "/no/such/folder"),
    (["dataset=nosuchset"], "nosuchset"),
    (["dataset=acdc", "dataset.roots=/x"], "roots"),
])
def test_bad_invocations_fail_with_one_line(args, message, capsys):
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_the_module_runs_as_a_command_and_prepares_the_cache(tmp_path):
    root, overrides = fake_download("prostate", tmp_path)
    cmd = [sys.executable, "-m", "mcseg.data.check"]
    env = {"MCSEG_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd + ["prepare", *overrides, "--workers", "1", "--no-progress"], capture_output=True,
                          text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "6 cases preprocessed" in done.stdout and str(tmp_path / "cache") in done.stdout
    (root / "labelsTr/prostate_003.nii.gz").unlink()
    done = subprocess.run(cmd + ["check", *overrides, "--workers", "2", "--no-progress"], capture_output=True,
                          text=True, env=env, timeout=240)
    assert done.returncode == 1 and "prostate_003.nii.gz: file not found" in done.stdout


def test_counts_of_one_are_singular(tmp_path, capsys):
    """'1 case', not '1 cases' (issue #12 item 15)."""
    from tests.fake_datasets import write_msd

    root = write_msd(tmp_path / "msd", n_cases=1)
    code, out = _run(capsys, ["dataset=msd", f"dataset.root={root}"])
    assert code == 0, out
    assert "summary: 1 case, 0 with errors" in out and "0 layout errors" in out
    assert "1 crescent" in out and "of voxels in 1 case" in out
    assert "1 cases" not in out

"""MONAI SaveImage probability maps (made by MONAI's SaveImage) read and evaluated by mcseg-evaluate-folder."""
from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch

from mcseg.evaluate_folder import main
from mcseg.evaluation.evaluator import Evaluator
from mcseg.config import EvalProtocol
from tests.tool_outputs import blob_label, make_monai

AFFINE = np.array([[0.0, -0.9, 0.0, 10.0], [1.1, 0.0, 0.0, -4.0], [0.0, 0.0, 2.0, 3.0], [0, 0, 0, 1]])
FAST = ["--bootstrap-samples", "0", "--no-failure-detection", "--no-figures"]


def _labels(root, shape, n=3):
    root.mkdir(parents=True)
    for i in range(n):
        nib.save(nib.Nifti1Image(blob_label(shape, i), AFFINE), str(root / f"case_{i}.nii.gz"))
    (root / "dataset.json").write_text(json.dumps({"labels": {"0": "background", "1": "outer", "2": "inner"}}))
    return root


@pytest.fixture(scope="module")
def monai3d(tmp_path_factory):
    root = tmp_path_factory.mktemp("monai3d")
    labels = _labels(root / "labels", (11, 9, 6))
    return labels, make_monai(root / "pred", labels)


def test_monai_maps_are_evaluated_as_read_with_nibabel(monai3d, tmp_path):
    labels, pred = monai3d
    out = tmp_path / "out"
    assert main([str(pred), str(labels), "-o", str(out), *FAST]) == 0
    summary = json.loads((out / "summary.json").read_text())
    provenance = summary.pop("provenance")
    ev = Evaluator(3, ["background", "outer", "inner"],
                   EvalProtocol(bootstrap_samples=0, failure_detection=False, figures=False))
    for i in range(3):
        label = np.asarray(nib.load(str(labels / f"case_{i}.nii.gz")).dataobj).astype(np.int64)
        img = nib.load(str(pred / f"case_{i}" / f"case_{i}_trans.nii.gz"))
        assert img.shape == (11, 9, 6, 3)  # SaveImage: channels last
        probs = torch.from_numpy(np.moveaxis(img.get_fdata(dtype=np.float32), -1, 0))
        ev.add_case(f"case_{i}", probs, torch.from_numpy(label), img.header.get_zooms()[:3])
    assert summary == json.loads(json.dumps(ev.summary()))
    assert provenance["predictions"][0]["format"] == "monai" and provenance["reference"]["kind"] == "labels"


def test_a_2d_map_saved_as_h_w_1_c_is_read(tmp_path):
    labels = _labels(tmp_path / "labels", (12, 10), n=2)
    pred = make_monai(tmp_path / "pred", labels)
    assert nib.load(str(pred / "case_0" / "case_0_trans.nii.gz")).shape == (12, 10, 1, 3)
    assert main([str(pred), str(labels), "-o", str(tmp_path / "out"), *FAST]) == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["mean_foreground_dice"] > 0.5


def _resave(path, change):
    img = nib.load(str(path))
    arr, affine = change(img.get_fdata(dtype=np.float32), img.affine.copy())
    nib.save(nib.Nifti1Image(arr, affine), str(path))


BREAKS = {
    "transposed": (lambda a, m: (a.swapaxes(0, 1), m),
                   r"case case_1: probabilities case_1_trans.nii.gz has shape \(9, 11, 6\) in the label's axis order, "
                   r"label case_1.nii.gz has \(11, 9, 6\)"),
    "sigmoids": (lambda a, m: (1 / (1 + np.exp(-(a * 4 - 1))), m),
                 r"case case_1: case_1_trans.nii.gz: the 3 softmax channels sum to .*, off 1 by up to 0.\d+"),
    "swapped-channels-and-one-dropped": (lambda a, m: (a[..., [1, 0]], m),
                                          r"case case_1: case_1_trans.nii.gz has 2 channels, the task is a softmax over 3"),
    "affine": (lambda a, m: (a, m + np.pad([[0, 0, 0, 0.5]], ((0, 3), (0, 0)))),
               r"case case_1: probabilities case_1_trans.nii.gz and label case_1.nii.gz have different affines "
               r"\(largest difference 0.5\)"),
    "one-channel": (lambda a, m: (a[..., 1], m), r"case case_1: case_1_trans.nii.gz has shape \(11, 9, 6\), expected 3 "
                                                 r"spatial axes and the channels last"),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_every_check_fails_in_one_line(monai3d, tmp_path, capsys, name):
    import shutil

    labels, pred = monai3d
    broken = tmp_path / "pred"
    shutil.copytree(pred, broken)
    change, message = BREAKS[name]
    _resave(broken / "case_1" / "case_1_trans.nii.gz", change)
    assert main([str(broken), str(labels), "-o", str(tmp_path / "out"), *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and __import__("re").search(message, err), err


def test_a_stated_format_the_folder_contradicts_and_missing_cases_are_refused(monai3d, tmp_path, capsys):
    labels, pred = monai3d
    assert main([str(pred), str(labels), "--format", "nnunet", *FAST]) == 2
    assert "--format nnunet contradicts the folder: it holds 3 <name>/<name>_trans.nii.gz (MONAI SaveImage)" in \
        capsys.readouterr().err
    assert main([str(pred), str(labels), "--monai-postfix", "seg", *FAST]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    (tmp_path / "labels").mkdir()
    for i in range(2):
        (tmp_path / "labels" / f"case_{i}.nii.gz").write_bytes((labels / f"case_{i}.nii.gz").read_bytes())
    (tmp_path / "labels" / "dataset.json").write_text((labels / "dataset.json").read_text())
    assert main([str(pred), str(tmp_path / "labels"), *FAST]) == 2
    assert "1 prediction(s) without a label" in capsys.readouterr().err


def test_an_msd_folder_and_a_labels_folder_with_nnunet_labels_one_folder_up_are_references(monai3d, tmp_path):
    labels, pred = monai3d
    msd = tmp_path / "Task01_Tiny"
    (msd / "labelsTr").mkdir(parents=True)
    for path in labels.glob("*.nii.gz"):
        (msd / "labelsTr" / path.name).write_bytes(path.read_bytes())
    (msd / "dataset.json").write_text(json.dumps({
        "labels": {"0": "background", "1": "outer", "2": "inner"}, "modality": {"0": "MRI"},
        "training": [{"image": f"./imagesTr/case_{i}.nii.gz", "label": f"./labelsTr/case_{i}.nii.gz"}
                     for i in range(3)]}))
    assert main([str(pred), str(msd), "-o", str(tmp_path / "msd"), *FAST]) == 0
    by_msd = json.loads((tmp_path / "msd" / "summary.json").read_text())
    assert by_msd["provenance"]["reference"]["kind"] == "msd"
    # a labels folder whose parent holds an nnU-Net dataset.json ({name: value})
    (msd / "dataset.json").write_text(json.dumps({"labels": {"background": 0, "outer": 1, "inner": 2},
                                                  "channel_names": {"0": "MRI"}, "file_ending": ".nii.gz"}))
    assert main([str(pred), str(msd / "labelsTr"), "-o", str(tmp_path / "plain"), *FAST]) == 0
    by_labels = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert by_labels["provenance"]["reference"]["kind"] == "labels" and by_labels["classes"] == ["outer", "inner"]
    assert by_labels["mean_ece"] == by_msd["mean_ece"]


def test_mcseg_report_lists_a_prediction_folder_as_a_row(monai3d, tmp_path):
    from mcseg.report.cli import main as report

    labels, pred = monai3d
    out = tmp_path / "evals" / "monai"
    assert main([str(pred), str(labels), "-o", str(out), "--bootstrap-samples", "0", "--no-figures"]) == 0
    assert report([str(tmp_path / "evals"), "--no-eval", "--out", str(tmp_path / "report"), "--bootstrap", "0"]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "MONAI SaveImage" in text and "predictions=" in text
    summary = json.loads((out / "summary.json").read_text())
    rows = list(__import__("csv").DictReader(open(tmp_path / "report" / "report.csv")))
    assert len(rows) == 1 and rows[0]["loss"] == "MONAI SaveImage"
    assert float(rows[0]["ece_mean"]) == pytest.approx(summary["mean_ece"], rel=1e-6)

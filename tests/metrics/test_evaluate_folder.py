"""mcseg-evaluate-folder: case matching, geometry checks, outputs equal to the Evaluator's."""
from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch

from mcseg.evaluation.evaluator import Evaluator
from mcseg.config import EvalProtocol
from mcseg.evaluate_folder import main

from .reference import blobs

AFFINE = np.diag([0.9, 1.1, 2.0, 1.0])


def _save(path, array, affine=AFFINE):
    nib.save(nib.Nifti1Image(np.asarray(array), affine), str(path))


@pytest.fixture
def folders(tmp_path):
    """Two cases: labels, label maps made by 'another tool', probability maps (channel last)."""
    dirs = {name: tmp_path / name for name in ("labels", "preds", "probs")}
    for d in dirs.values():
        d.mkdir()
    cases = {}
    for i, case in enumerate(("case_01", "case_02")):
        label = blobs((18, 16, 10), 3, seed=i)
        g = torch.Generator().manual_seed(i)
        logits = torch.nn.functional.one_hot(label, 3).movedim(-1, 0).float() * 3
        probs = torch.softmax(logits + torch.randn(3, 18, 16, 10, generator=g), 0)
        pred = probs.argmax(0)
        _save(dirs["labels"] / f"{case}.nii.gz", label.numpy().astype(np.uint8))
        _save(dirs["preds"] / f"{case}.nii.gz", pred.numpy().astype(np.int16))
        _save(dirs["probs"] / f"{case}_probs.nii.gz", np.moveaxis(probs.numpy(), 0, -1))
        cases[case] = (probs, label, pred)
    return dirs, cases


def test_cli_matches_the_evaluator(folders, tmp_path, capsys):
    dirs, cases = folders
    out = tmp_path / "out"
    code = main([str(dirs["preds"]), str(dirs["labels"]), "--probs", str(dirs["probs"]), "--num-classes", "3",
                 "-o", str(out), "--bootstrap-samples", "50", "--region", "all"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    ev = Evaluator(3, ["background", "class_1", "class_2"], EvalProtocol(region="all", bootstrap_samples=50))
    for case, (probs, label, _) in cases.items():
        spacing = nib.load(str(dirs["labels"] / f"{case}.nii.gz")).header.get_zooms()  # float32 in the header
        ev.add_case(case, probs, label, spacing)
    # the evaluator's summary, plus what produced it (every input file's sha256) and failure detection
    provenance, detection = summary.pop("provenance"), summary.pop("failure_detection")
    assert summary == json.loads(json.dumps(ev.summary()))
    assert "foreground mean" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"per_case.csv", "summary.json", "reliability.csv", "reliability.png",
                                               "reliability_histogram.csv", "reliability_histogram.png",
                                               "provenance.json", "failure_per_case.csv", "status.json"}
    assert json.loads((out / "status.json").read_text())["status"] == "completed"  # as a run's is
    assert provenance["predictions"][0]["format"] == "mcseg" and len(provenance["input_files_sha256"]) == 6
    assert 0.5 < detection["predictive_entropy"]["voxel_auroc"] <= 1


def test_labels_only_and_classes_from_dataset_json(folders, tmp_path):
    dirs, _ = folders
    (dirs["labels"] / "dataset.json").write_text(json.dumps({"labels": {"0": "bg", "1": "left", "2": "right"}}))
    assert main([str(dirs["preds"]), str(dirs["labels"]), "--bootstrap-samples", "0", "--save-uncertainty"]) == 2
    assert main([str(dirs["preds"]), str(dirs["labels"]), "--bootstrap-samples", "0"]) == 0
    summary = json.loads((dirs["preds"] / "eval/summary.json").read_text())
    assert summary["classes"] == ["left", "right"] and summary["mean_ece"] is None
    assert summary["mean_foreground_dice"] > 0.5


def test_uncertainty_maps_are_written_beside_the_predictions(folders, tmp_path):
    dirs, cases = folders
    code = main([str(dirs["preds"]), str(dirs["labels"]), "--probs", str(dirs["probs"]), "--save-uncertainty",
                 "-o", str(tmp_path / "out"), "--bootstrap-samples", "0"])
    assert code == 0
    img = nib.load(str(dirs["preds"] / "case_01_entropy.nii.gz"))
    probs = cases["case_01"][0].double()
    np.testing.assert_allclose(img.get_fdata(), -(probs * probs.log()).sum(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(img.affine, AFFINE)


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda d: _save(d["preds"] / "case_02.nii.gz", np.zeros((18, 16, 9), np.uint8)),
         r"has shape \(18, 16, 9\) in the label's axis order, label case_02.nii.gz has \(18, 16, 10\)"),
        (lambda d: _save(d["preds"] / "case_02.nii.gz", np.zeros((18, 16, 10), np.uint8),
                         np.diag([0.9, 1.1, 2.5, 1.0])), "spacing"),
        (lambda d: _save(d["preds"] / "case_02.nii.gz", np.zeros((18, 16, 10), np.uint8),
                         AFFINE + np.array([[0, 0, 0, 5.0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])),
         "different affines"),
        (lambda d: (d["labels"] / "case_02.nii.gz").unlink(), "prediction\\(s\\) without a label"),
        (lambda d: (d["preds"] / "case_02.nii.gz").unlink(), "label\\(s\\) without a prediction"),
        (lambda d: (d["probs"] / "case_02_probs.nii.gz").unlink(), "without <case>_probs"),
        (lambda d: _save(d["probs"] / "case_02_probs.nii.gz", np.full((18, 16, 10, 2), 0.5, np.float32)),
         "has 2 channels, the task is a softmax over 3 labels"),
        (lambda d: _save(d["preds"] / "case_02.nii.gz", np.full((18, 16, 10), 0.5, np.float32)), "non-integer"),
        (lambda d: _save(d["preds"] / "case_02.nii.gz", np.full((18, 16, 10), 7, np.uint8)), "values must lie"),
    ],
    ids=["shape", "spacing", "affine", "no-label", "no-prediction", "no-probs", "channels", "float-labels",
         "bad-class"],
)
def test_mismatches_are_refused_with_a_clear_message(folders, capsys, break_it, message):
    dirs, _ = folders
    break_it(dirs)
    code = main([str(dirs["preds"]), str(dirs["labels"]), "--probs", str(dirs["probs"]), "--num-classes", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "mcseg-evaluate-folder: error:" in err
    assert __import__("re").search(message, err), err
    assert "case_02" in err or "1 " in err


def test_missing_predictions_allowed_on_request(folders, tmp_path):
    dirs, _ = folders
    (dirs["preds"] / "case_02.nii.gz").unlink()
    assert main([str(dirs["preds"]), str(dirs["labels"]), "--num-classes", "3", "--allow-missing",
                 "--bootstrap-samples", "0"]) == 0
    assert json.loads((dirs["preds"] / "eval/summary.json").read_text())["n_cases"] == 1


def test_number_of_classes_is_never_guessed_from_the_labels(folders, capsys):
    dirs, _ = folders
    assert main([str(dirs["preds"]), str(dirs["labels"])]) == 2
    assert "--num-classes" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::FutureWarning")  # MONAI's own deprecation inside get_mask_edges
def test_real_hippocampus_cases(hippocampus_root, tmp_path):
    """Two real MSD cases with a prediction that erodes the label; HD95 as MONAI computes it."""
    import csv

    from monai.metrics import compute_hausdorff_distance
    from scipy.ndimage import binary_erosion

    labels, preds = tmp_path / "labels", tmp_path / "preds"
    labels.mkdir(), preds.mkdir()
    expected = {}
    for name in ("hippocampus_001", "hippocampus_003"):
        img = nib.load(str(hippocampus_root / "labelsTr" / f"{name}.nii.gz"))
        label = np.asarray(img.dataobj).astype(np.int64)
        pred = label * binary_erosion(label > 0)
        nib.save(img, str(labels / f"{name}.nii.gz"))
        nib.save(nib.Nifti1Image(pred.astype(np.uint8), img.affine, img.header), str(preds / f"{name}.nii.gz"))
        onehot = lambda a: torch.nn.functional.one_hot(torch.from_numpy(a), 3).movedim(-1, 0)[None].float()  # noqa: E731
        hd = compute_hausdorff_distance(onehot(pred), onehot(label), percentile=95,
                                        spacing=[float(z) for z in img.header.get_zooms()])
        expected[name] = hd[0].tolist()
    (labels.parent / "dataset.json").write_text((hippocampus_root / "dataset.json").read_text())
    assert main([str(preds), str(labels), "--bootstrap-samples", "0"]) == 0
    summary = json.loads((preds / "eval/summary.json").read_text())
    assert summary["classes"] == ["Anterior", "Posterior"] and summary["n_cases"] == 2
    with open(preds / "eval/per_case.csv") as f:
        for row in csv.DictReader(f):
            assert float(row["hd95_mm"]) == pytest.approx(expected[row["case"]][int(row["class_index"]) - 1], rel=1e-6)


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_evaluation_is_never_replaced_unless_asked_nor_written_into_a_prediction_folder(folders, tmp_path,
                                                                                           capsys):
    """Issue #43 section 3: -o into an existing evaluation silently replaced all its files."""
    dirs, _ = folders
    args = [str(dirs["preds"]), str(dirs["labels"]), "--probs", str(dirs["probs"]), "--num-classes", "3",
            "--bootstrap-samples", "0", "--no-figures"]
    out = tmp_path / "out"
    assert main([*args, "-o", str(out)]) == 0
    capsys.readouterr()
    first = _snapshot(out)
    assert main([*args, "-o", str(out), "--region", "all"]) == 2
    err = capsys.readouterr().err
    assert f"-o {out}" in err and "evaluation" in err and "--overwrite" in err and len(err.splitlines()) == 1, err
    assert _snapshot(out) == first
    assert main([*args, "-o", str(out), "--region", "all", "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["protocol"]["region"] == "all"
    # a folder of predictions (the probability maps) is never an evaluation's folder, even with --overwrite
    before = _snapshot(dirs["probs"])
    assert main([*args, "-o", str(dirs["probs"]), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"-o {dirs['probs']}" in err and "predictions" in err and "a new folder" in err, err
    assert _snapshot(dirs["probs"]) == before


def test_an_ensemble_of_a_folder_with_itself_or_a_copy_is_refused(folders, tmp_path, capsys):
    """Issue #43 section 3: --ensemble of a folder with itself or a byte-identical copy counted as two members
    (evaluate.py refuses checkpoints with identical weights)."""
    import shutil

    dirs, _ = folders
    copy = shutil.copytree(dirs["probs"], tmp_path / "copy")
    args = [str(dirs["probs"]), str(dirs["labels"]), "--num-classes", "3", "--bootstrap-samples", "0", "--no-figures"]
    for member, said in ((dirs["probs"], "twice"), (copy, "identical")):
        out = tmp_path / f"out_{member.name}"
        assert main([*args, "--ensemble", str(member), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert said in err and str(member) in err and len(err.splitlines()) == 1, err
        assert not out.exists()
    # a member that differs in one file is a member
    _save(copy / "case_02_probs.nii.gz", np.full((18, 16, 10, 3), 1 / 3, np.float32))
    assert main([*args, "--ensemble", str(copy), "-o", str(tmp_path / "two")]) == 0
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["predictor"]["members"] == 2


def test_ctrl_c_ends_in_one_line_and_marks_the_evaluation_interrupted_which_the_report_leaves_out(
        folders, tmp_path, capsys, monkeypatch):
    """Issue #43 section 3: Ctrl-C in mcseg-evaluate-folder ended in a traceback and left a half-written folder
    (summary.json without its failure table and provenance.json) that mcseg-report listed as complete."""
    from mcseg.evaluation import folders as folder_module
    from mcseg.report.cli import failure_lines
    from mcseg.report.collect import collect_folder_evaluations

    dirs, _ = folders
    out = tmp_path / "evals" / "out"
    args = [str(dirs["preds"]), str(dirs["labels"]), "--probs", str(dirs["probs"]), "--num-classes", "3",
            "--bootstrap-samples", "0", "--no-figures", "-o", str(out)]

    def ctrl_c(*args, **kwargs):  # Ctrl-C once summary.json is written, before the failure table
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_module, "write_csv", ctrl_c)
    try:
        code = main(args)
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped: a traceback"
    assert code == 130
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "interrupted" in err and str(out) in err, err
    assert "run the same command again" in err
    assert (out / "summary.json").is_file() and not (out / "provenance.json").exists()  # half a folder
    assert json.loads((out / "status.json").read_text())["status"] == "interrupted"
    record, = collect_folder_evaluations([tmp_path / "evals"])
    assert record.status == "interrupted" and not record.evaluated  # not a row of the report's tables
    assert any(str(out) in line and "interrupted" in line for line in failure_lines([record]))
    # the advice works: the same command again, without --overwrite
    monkeypatch.undo()
    assert main(args) == 0
    record, = collect_folder_evaluations([tmp_path / "evals"])
    assert record.status == "completed" and record.evaluated and (out / "provenance.json").is_file()


@pytest.mark.slow
def test_a_real_sigint_ends_the_command_in_one_line_without_a_traceback(folders, tmp_path):
    """The same through a real SIGINT (what Ctrl-C sends) in a process of its own, while the first case is scored."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    dirs, _ = folders
    out = tmp_path / "out"
    # a process started in the background by a non-interactive shell inherits SIGINT ignored (CI launched with
    # `&` did): restore Python's own handler, as an interactive terminal's process has it
    code = ("import os, signal, sys\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from mcseg.evaluation.evaluator import Evaluator\n"
            "scored = Evaluator.add_case\n"
            "def add_case(self, *args, **kwargs):\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    return scored(self, *args, **kwargs)\n"
            "Evaluator.add_case = add_case\n"
            "from mcseg.evaluate_folder import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    args = [str(dirs["preds"]), str(dirs["labels"]), "--probs", str(dirs["probs"]), "--num-classes", "3",
            "--bootstrap-samples", "0", "--no-figures", "-o", str(out)]
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 130, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "run the same command again" in done.stderr, done.stderr
    assert json.loads((out / "status.json").read_text())["status"] == "interrupted"
    assert not (out / "run.lock").exists()

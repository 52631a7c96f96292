"""mcseg-new-cases on MONAI SaveImage folders: statements for new cases with and without their labels (the labels
change only the measured columns, never a bound), the rows against the written per-case tables, and the refusals
(a calibration case among the new ones, label maps without probabilities, other classes, too few cases)."""
from __future__ import annotations

import csv
import json
import math
import shutil

import nibabel as nib
import numpy as np
import pytest

from mcseg.new_cases import main as new_cases
from mcseg.statements.table import read_table
from tests.statements.conftest import CALIBRATION, NEW

NAMES = ["--class-names", "background", "left", "right"]


def _run(folders, out, *extra, reference=None):
    return new_cases(["--fit", str(folders["fit"]), "--reference", str(reference or folders["labels"]),
                      "--apply", str(folders["new"]), "-o", str(out), *NAMES, *extra])


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_statements_with_and_without_the_new_labels(folders, tmp_path, capsys):
    labelled, blind = tmp_path / "labelled", tmp_path / "blind"
    assert _run(folders, labelled, "--alpha", "0.2", "--figure") == 0
    printed = capsys.readouterr().out
    assert (labelled / "statements.png").read_bytes()[:4] == b"\x89PNG"
    assert "guarantee: each statement holds with probability >= 0.8" in printed and "n = 20" in printed
    record = json.loads((labelled / "statements.json").read_text())
    assert record["new_cases"] == NEW and record["calibration_cases"] == CALIBRATION
    assert record["new_cases_labels"].startswith("used only to measure")
    rows = _rows(labelled / "statements.csv")
    assert len(rows) == 2 * len(NEW) and {r["structure"] for r in rows} == {"left", "right"}
    assert {"volume_true_ml", "dice_covered", "failure"} <= set(rows[0])
    # the same statements from the label-free figures alone: the new labels fitted nothing
    assert _run(folders, blind, "--alpha", "0.2", "--images", str(folders["images"]),
                reference=folders["fit_labels"]) == 0
    blind_rows = _rows(blind / "statements.csv")
    assert "volume_true_ml" not in blind_rows[0]
    assert json.loads((blind / "statements.json").read_text())["new_cases_labels"] == "none"
    for a, b in zip(rows, blind_rows):
        assert all(a[k] == b[k] for k in b)
    # the bounds follow from the written tables: k-th smallest calibration score, k = ceil(21 x 0.8) = 17
    calibration = read_table(labelled / "calibration_cases.csv")
    f = calibration.figures
    for k, structure in enumerate(calibration.structures):
        q = np.sort(np.abs(f["volume_true_ml"][:, k] - f["volume_mask_ml"][:, k]))[16]
        row = next(r for r in rows if r["structure"] == structure)
        assert math.isclose(float(row["volume_upper_ml"]), float(row["volume_mask_ml"]) + q, rel_tol=1e-9)
        assert math.isclose(record["quantiles"]["volume"][structure], q, rel_tol=1e-12)
        d = np.sort(f["soft_dice"][:, k] - f["dice_true"][:, k])[16]
        assert math.isclose(float(row["dice_lower"]), max(float(row["dice_estimate"]) - d, 0), abs_tol=1e-12)
    # the volumes are counts of the written labels in mL
    new = read_table(labelled / "new_cases.csv")
    img = nib.load(str(folders["labels"] / f"{NEW[0]}.nii.gz"))
    count = (np.asarray(img.dataobj) == 1).sum() * np.prod(img.header.get_zooms()) / 1000
    assert math.isclose(new.figures["volume_true_ml"][0, 0], count, rel_tol=1e-6)  # float32 zooms


def test_weighted_statements_report_the_effective_sample_size(folders, tmp_path):
    out = tmp_path / "weighted"
    assert _run(folders, out, "--shift", "weighted") == 0
    record = json.loads((out / "statements.json").read_text())
    assert 0 < record["shift"]["n_eff"] <= len(CALIBRATION)
    assert all(float(r["weight"]) > 0 for r in _rows(out / "statements.csv"))


def test_refusals_name_the_problem_and_write_nothing(folders, tmp_path, capsys):
    out = tmp_path / "out"
    # a calibration case among the new ones
    mixed = tmp_path / "mixed"
    shutil.copytree(folders["new"], mixed)
    shutil.copytree(folders["fit"] / CALIBRATION[0], mixed / CALIBRATION[0])
    assert new_cases(["--fit", str(folders["fit"]), "--reference", str(folders["labels"]), "--apply", str(mixed),
                      "-o", str(out), *NAMES]) == 2
    assert "1 calibration case(s) (case_000)" in capsys.readouterr().err and not out.exists()
    # other classes: the folders hold 3 channels
    assert _run(folders, out, "--class-names", "background", "left") == 2
    assert "left" in capsys.readouterr().err and not out.exists()
    # new cases without a label and without their images
    assert _run(folders, out, reference=folders["fit_labels"]) == 2
    assert "need --images" in capsys.readouterr().err and not out.exists()
    # a bad level
    assert _run(folders, out, "--alpha", "1.5") == 2
    assert "--alpha 1.5" in capsys.readouterr().err and not out.exists()


def test_label_maps_are_not_probabilities(folders, tmp_path, capsys):
    maps = tmp_path / "maps"
    for case in NEW:
        (maps / case).mkdir(parents=True)
        shutil.copy2(folders["labels"] / f"{case}.nii.gz", maps / case / f"{case}_trans.nii.gz")
    out = tmp_path / "out"
    code = new_cases(["--fit", str(folders["fit"]), "--reference", str(folders["labels"]), "--apply", str(maps),
                      "-o", str(out), *NAMES])
    assert code == 2 and not out.exists()
    assert "case_020_trans.nii.gz has shape (12, 10, 8)" in capsys.readouterr().err


def test_too_few_calibration_cases_give_infinite_bounds_said_in_words(folders, tmp_path, capsys):
    few = tmp_path / "few"
    for case in CALIBRATION[:5]:
        shutil.copytree(folders["fit"] / case, few / case)
    out = tmp_path / "out"
    assert new_cases(["--fit", str(few), "--reference", str(folders["labels"]), "--apply", str(folders["new"]),
                      "-o", str(out), *NAMES]) == 0
    printed = capsys.readouterr().out
    assert "5 calibration cases are too few for finite bounds at alpha 0.1 (at least 9; 5 cases allow alpha >= " \
           "0.167, option --alpha" in printed
    assert "flag every case" in printed
    assert all(float(r["volume_upper_ml"]) == math.inf for r in _rows(out / "statements.csv"))


def test_the_report_lists_the_cases_flagged_first(folders, tmp_path):
    from mcseg.report.cli import main as report

    out = tmp_path / "outputs" / "statements"
    assert _run(folders, out, "--alpha", "0.2", "--floor", "0.6") == 0
    rows = _rows(out / "statements.csv")
    assert report([str(tmp_path / "outputs"), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Statements for new cases" in text and "n = 20 calibration cases" in text
    table = [line for line in text.splitlines() if line.startswith("| case_")]
    flagged = {r["case"] for r in rows if r["review"] == "True"}
    assert len(table) == len(NEW)
    assert [line.split(" | ")[0][2:] for line in table[:len(flagged)]] == sorted(
        flagged, key=lambda c: -float(next(r["risk_score"] for r in rows if r["case"] == c))) or not flagged
    assert "Measured on the new cases' labels (never fitted on)" in text

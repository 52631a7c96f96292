"""report.html of the folder commands' outputs (mcseg/report/folder_report.py) on tiny MONAI SaveImage folders:
mcseg-new-cases' page lists the flagged cases first in its QC table and its case view, with the statements figure
inline; mcseg-conformal-folder's draws the sure / possible masks, worst Dice first, with its coverage figure;
mcseg-calibrate-folder's ECE before and after equals an independent recomputation from the files; a case without
an image draws the probability and says so; mcseg-report FOLDER writes the same page; an output folder that cannot
be written is refused naming it, with nothing written. Every page requests nothing (data: URIs only)."""
from __future__ import annotations

import json
import re

import nibabel as nib
import numpy as np
import pytest

from mcseg.report.cli import main as report_main

NAMES = ["--class-names", "background", "left", "right"]


def cases_of(page: str) -> list[dict]:
    found = re.search(r'<script type="application/json" id="case-data">(.*?)</script>', page, re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


def _self_contained(page: str) -> None:
    for attribute in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert attribute.startswith("data:"), f"the page refers to {attribute[:60]}"


def make_folders(root):
    """Twelve cases under ``root``: labels, images, and MONAI SaveImage probabilities of 8 fit cases (``fit``) and 4
    new ones (``new``)."""
    from tests.tool_outputs import make_monai_study

    return make_monai_study(root, n_cases=12, n_fit=8, noise=1.6)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return make_folders(tmp_path_factory.mktemp("folder_report"))


def _args(folders, out, *extra):
    return ["--fit", str(folders["fit"]), "--reference", str(folders["labels"]), "--apply", str(folders["new"]),
            "-o", str(out), *NAMES, *extra]


def test_an_output_folder_that_cannot_be_written_is_refused_naming_it(tmp_path, capsys):
    """Before: mcseg-report said 'no runs' (or failed on mkdir after evaluating), a folder command a traceback
    from its lock file. Now: one line naming the folder, before anything is read, and nothing is created."""
    from mcseg.calibrate_folder import main as calibrate

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    (tmp_path / "runs").mkdir()
    assert report_main([str(tmp_path / "runs"), "--out", str(blocker / "report"), "--no-eval"]) == 1
    assert f"--out {blocker / 'report'}: the output folder cannot be written" in capsys.readouterr().err
    assert calibrate(["--fit", str(tmp_path), "--reference", str(tmp_path), "-o", str(blocker / "cal"), *NAMES]) == 2
    assert f"-o {blocker / 'cal'}: the output folder cannot be written" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "runs"]


def test_case_order_puts_flagged_cases_first_then_the_riskiest():
    from mcseg.report.statements import case_order

    rows = [{"case": c, "structure": s, "review": flag, "risk_score": risk} for c, flag, risk in
            (("a", False, 0.9), ("b", True, 0.2), ("c", True, 0.5), ("d", False, 0.1)) for s in ("left", "right")]
    assert case_order({"rows": rows}) == [("c", True, 0.5), ("b", True, 0.2), ("a", False, 0.9), ("d", False, 0.1)]


@pytest.mark.slow
def test_statements_page_lists_flagged_cases_first_and_draws_the_probability_without_images(folders, tmp_path):
    from mcseg.new_cases import main as new_cases
    from mcseg.report.statements import case_order

    out = tmp_path / "statements"
    assert new_cases(_args(folders, out, "--alpha", "0.25", "--floor", "0.8")) == 0
    page = (out / "report.html").read_text()
    _self_contained(page)
    record = json.loads((out / "statements.json").read_text())
    order = case_order(record)
    table = [line.split("|")[1].strip() for line in (out / "report.md").read_text().splitlines()
             if line.startswith("| case_")]
    assert table == [case for case, _, _ in order]  # flagged first, then the riskiest
    drawn = cases_of(page)
    assert [c["id"] for c in drawn] == [case for case, _, _ in order][:6]
    assert drawn[0]["source"].startswith("FLAGGED for review" if order[0][1] else "ok")
    assert "Volume intervals and coverage" in page and 'alt="statements" src="data:image/png;base64,' in page
    # the new cases' images are not given nor beside the reference: the probability is drawn, and said
    assert drawn[0]["background"] == "probability"
    assert any("foreground probability 1 - p_0 is drawn instead" in n for n in drawn[0]["notes"])


@pytest.mark.slow
def test_conformal_page_draws_sure_and_possible_worst_dice_first(folders, tmp_path):
    from mcseg.conformal_folder import main as conformal

    out = tmp_path / "conformal"
    assert conformal(_args(folders, out, "--alpha", "0.3", "--repeats", "5", "--images", str(folders["images"]),
                           "--html-cases", "3")) == 0
    page = (out / "report.html").read_text()
    _self_contained(page)
    drawn = cases_of(page)
    assert len(drawn) == 3 and all({"sure", "possible", "label", "image"} <= set(c["layers"]) for c in drawn)
    assert [c["dice"] for c in drawn] == sorted(c["dice"] for c in drawn)
    assert "Over random re-splits" in page and '<img alt="coverage' in page  # the coverage figure, inline
    # mcseg-report FOLDER: the same page, into --out
    assert report_main([str(out), "--out", str(tmp_path / "again"), "--images", str(folders["images"]), *NAMES]) == 0
    assert [c["id"] for c in cases_of((tmp_path / "again" / "report.html").read_text())][:3] == \
        [c["id"] for c in drawn]


@pytest.mark.slow
def test_calibration_page_ece_before_and_after_equals_a_recomputation(folders, tmp_path):
    from mcseg.calibrate_folder import main as calibrate
    from mcseg.data.reference import read_reference
    from mcseg.evaluation.folders import read_case
    from mcseg.evaluation.formats import open_folder

    out = tmp_path / "cal"
    assert calibrate(_args(folders, out, "--images", str(folders["images"]))) == 0
    text = (out / "report.md").read_text()
    reference = read_reference(folders["labels"], ["background", "left", "right"])

    def ece(folder):  # top-label, 15 equal-width bins, over label or prediction foreground, pooled over cases
        conf, correct = [], []
        for case in ("case_08", "case_09", "case_10", "case_11"):
            _, _, probs, _, _ = read_case([open_folder(folder, reference.task)], reference, case)
            p = probs.numpy().astype(np.float64)
            label = np.asarray(nib.load(str(folders["labels"] / f"{case}.nii.gz")).dataobj)
            region = (label > 0) | (p.argmax(0) > 0)
            conf.append(p.max(0)[region])
            correct.append((p.argmax(0) == label)[region])
        conf, correct = np.concatenate(conf), np.concatenate(correct)
        bins = np.minimum((conf * 15).astype(int), 14)
        return sum(abs(conf[bins == b].sum() - correct[bins == b].sum()) for b in range(15)) / len(conf)

    before = re.search(r"^\| before \| ([0-9.]+) \|", text, re.M).group(1)
    after = re.search(r"^\| after \| ([0-9.]+) \|", text, re.M).group(1)
    assert float(before) == pytest.approx(ece(folders["new"]), abs=6e-5)
    assert float(after) == pytest.approx(ece(out), abs=6e-5)
    page = (out / "report.html").read_text()
    _self_contained(page)
    assert page.count('<svg class="reliability"') == 2 and "after calibration" in page
    assert len(cases_of(page)) == 4

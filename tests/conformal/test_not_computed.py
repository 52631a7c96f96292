"""Figures a conformal fit could not compute (null in conformal.json: no finite margin when alpha < 1/(n+1)) are
said as "not computed" by mcseg-conformal-folder and by an evaluation's conformal pass, never as Python's None; the
report's table says what its "–" means (issue 55)."""
from __future__ import annotations

import json

from mcseg.conformal_folder import main as conformal_folder
from mcseg.data.synthetic import SyntheticDataset
from mcseg.evaluation.conformal import ConformalConfig, conformal_pass
from mcseg.report.conformal import ConformalFit, conformal_section
from tests.conformal.synthetic import Oracle, mcseg_folder


def test_the_folder_command_says_not_computed(tmp_path, capsys):
    mcseg_folder(tmp_path / "fit", tmp_path / "labels", [f"a{i:02d}" for i in range(4)], 1)
    out = tmp_path / "conformal"
    # 4 calibration cases, alpha = 0.1 < 1/5: no finite margin
    assert conformal_folder(["--fit", str(tmp_path / "fit"), "--reference", str(tmp_path / "labels"), "-o", str(out),
                             "--repeats", "0"]) == 0
    assert json.loads((out / "conformal.json").read_text())["classes"]["outer"]["margin"]["outer_mm"] is None
    printed = capsys.readouterr().out
    assert "None" not in printed and "margins not computed out, not computed in" in printed, printed


def test_the_evaluations_pass_says_not_computed(tmp_path, capsys):
    dataset = SyntheticDataset(shape=(16, 16), n_cases=5, seed=3)
    refs = dataset.case_refs()
    (tmp_path / "summary.json").write_text("{}")
    config = ConformalConfig(enabled=True, alpha=0.1, repeats=0, masks=False, posthoc=False)
    summary = conformal_pass(config, Oracle(), dataset, refs[:3], dataset, refs[3:], {}, tmp_path, {}, {})
    assert all(c["outer_mm"] is None for c in summary["conformal"]["raw"]["classes"].values())
    printed = capsys.readouterr().out
    assert "None" not in printed and printed.count("margins not computed out, not computed in") == 3, printed


def test_the_reports_table_says_what_its_dash_means(tmp_path):
    record = {"alpha": 0.1, "method": "crc", "loss": "fnr",
              "classes": {"a": {"threshold": 0.0, "controlled": False, "n_cases": 3,
                                "margin": {"outer_mm": None, "inner_mm": None}}}}
    text = "\n".join(conformal_section([ConformalFit("run", "raw", tmp_path, record)], tmp_path))
    assert "| run | raw | a | 0 | NO | – / 0.1 | – | – | – | 3 |" in text and "None" not in text
    assert "–: not computed" in text

"""mcseg-report's "Conformal guarantees" shows every conformal fit (issue #46, item 4): a run's evaluation and its
TTA variant's, an ensemble's evaluation, and mcseg-conformal-folder outputs (under a report directory or given as
one; an unfinished one left out); for each fit split again at random, its coverage figure and, per class at the
fit's alpha, the mean test risk and the violation rate over the splits with their standard errors."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from mcseg.conformal_folder import main as conformal_folder
from mcseg.data.synthetic import SyntheticDataset
from mcseg.evaluation.conformal import ConformalConfig, conformal_pass
from mcseg.report.cli import main as report
from tests.conformal.synthetic import Oracle, mcseg_folder
from tests.test_rundir import _fake_run


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_sources")
    dataset = SyntheticDataset(shape=(16, 16), n_cases=12, seed=3)
    refs = dataset.case_refs()
    config = ConformalConfig(enabled=True, alpha=0.3, repeats=10, alphas=[0.2], masks=False, posthoc=False,
                             figures=1)
    run = root / "runs" / "run"
    _fake_run(run, "synthetic", "ce", 0, 0.8, 0.5)
    variant = run / "eval" / "test-tta-flips"
    variant.mkdir()
    (variant / "summary.json").write_text(json.dumps({"mean_foreground_dice": 0.8, "predictor": {"tta": ["flips"]}}))
    ensemble = root / "runs" / "ensembles" / "pair" / "test"
    ensemble.mkdir(parents=True)
    (ensemble / "summary.json").write_text(json.dumps({"mean_foreground_dice": 0.8,
                                                       "provenance": {"members": [{"run_dir": str(run)}]}}))
    for folder, node in ((run / "eval" / "test", config), (variant, config),
                         (ensemble, replace(config, method="rcps", delta=0.2))):
        conformal_pass(node, Oracle(), dataset, refs[:6], dataset, refs[6:], {}, folder, {}, {})
    labels = root / "labels"
    mcseg_folder(root / "fit", labels, [f"a{i:02d}" for i in range(8)], 1)
    mcseg_folder(root / "test", labels, [f"b{i:02d}" for i in range(4)], 2)
    outputs = {}
    for name in ("nnunet_conformal", "runs/unfinished"):  # outside the runs' directory, and inside it
        outputs[name] = root / name
        assert conformal_folder(["--fit", str(root / "fit"), "--reference", str(labels), "--apply",
                                 str(root / "test"), "-o", str(outputs[name]), "--alpha", "0.3", "--repeats", "10",
                                 "--alphas", "0.2"]) == 0
    status = json.loads((outputs["runs/unfinished"] / "status.json").read_text())
    (outputs["runs/unfinished"] / "status.json").write_text(json.dumps({**status, "status": "failed"}))
    return root, {"run": run / "eval/test/conformal/raw", "run (tta-flips)": variant / "conformal/raw",
                  "ensemble pair": ensemble / "conformal/raw"}, outputs["nnunet_conformal"]


def _section(out) -> str:
    text = (out / "report.md").read_text()
    return text[text.index("## Conformal guarantees"):].split("\n## ")[0]


def _check_fit(section: str, out, label: str, source: str, folder) -> None:
    record = json.loads((folder / "conformal.json").read_text())
    for name, fit in record["classes"].items():
        test = record["test"][name]
        assert (f"| {label} | {source} | {name} | {fit['threshold']:.3g} | {'yes' if fit['controlled'] else 'NO'} | "
                f"{test['mean_loss']:.3f} / 0.3 | {test['mean_set_over_prediction']:.3f} |") in section, (label, name)
    assert f"![coverage {label} {source}]({os.path.relpath(folder / 'coverage.png', out)})" in section
    assert (out / os.path.relpath(folder / "coverage.png", out)).is_file()
    rows = [r for r in record["validity"]["rows"] if r["alpha"] == 0.3]
    assert rows and len(rows) == len(record["classes"])
    for row in rows:
        assert (f"- {row['class']}: mean test FNR {row['mean_test_risk']:.3f} ± {row['mean_test_risk_se']:.3f} "
                f"(alpha = 0.3); test FNR > alpha in {row['violation_rate']:.3f} ± {row['violation_rate_se']:.3f} "
                f"of the splits") in section, (label, row["class"])


def test_runs_variants_ensembles_and_folder_outputs(fits, tmp_path):
    root, evaluations, folder = fits
    out = tmp_path / "report"
    assert report([str(root / "runs"), str(folder), "--out", str(out), "--no-eval", "--bootstrap", "10"]) == 0
    section = _section(out)
    for label, path in evaluations.items():
        _check_fit(section, out, label, "raw", path)
    _check_fit(section, out, f"{root.name}/nnunet_conformal", "saved mcseg", folder)
    assert "at most delta = 0.2 promised" in section  # the ensemble's RCPS bounds the violation rate
    assert "CRC bounds the mean, not this" in section
    assert "dependent repeats" in section and "unfinished" not in section  # its status.json: failed
    first = json.loads((evaluations["ensemble pair"] / "conformal.json").read_text())["applied"]["split_cases"][0]
    assert f"({os.path.relpath(evaluations['ensemble pair'] / f'{first}_conformal.png', out)})" in section


def test_a_folder_output_alone(fits, tmp_path):
    root, _, folder = fits
    moved = tmp_path / "conformal_only"
    shutil.copytree(folder, moved)
    assert report([str(moved), "--out", str(tmp_path / "report"), "--no-eval", "--bootstrap", "10"]) == 0
    _check_fit(_section(tmp_path / "report"), tmp_path / "report", f"{tmp_path.name}/conformal_only", "saved mcseg",
               moved)

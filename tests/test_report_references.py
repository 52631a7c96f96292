"""Issue #43 section 3: what the report compares. Rows scored against different references (runs trained on
different rater targets: each one's single-label columns are scored against its own target's label) are never
selected or tested against each other; folder evaluations are told apart by their whole reference folder, and of
two evaluations of one prediction folder the one of its current files is reported."""
from __future__ import annotations

import json
from pathlib import Path

from mcseg.report.collect import collect_runs
from mcseg.report.table import build_rows

from .test_rundir import _fake_run


def _target_run(run: Path, loss: str, seed: int, dice: float, score: float, target: str | None,
                recorded: bool = True) -> None:
    """A run of ``loss`` trained on ``dataset.raters.target=<target>`` (None: the default), given on the command
    line; ``recorded``: its evaluation's provenance names the target (evaluations of older versions do not)."""
    _fake_run(run, "qubiq", loss, seed, dice, score)
    overrides = [f"loss={loss}"] + ([f"dataset.raters.target={target}"] if target else [])
    result = json.loads((run / "result.json").read_text())
    result["run"].update(configuration=" ".join(sorted(overrides)), overrides=overrides)
    (run / "result.json").write_text(json.dumps(result))
    if recorded:
        summary_path = run / "eval/test/summary.json"
        summary = json.loads(summary_path.read_text())
        summary["provenance"] = {"dataset": {"name": "qubiq", "raters_target": target or "majority"}}
        summary_path.write_text(json.dumps(summary))
    per_case = run / "eval/test/per_case.csv"  # per-case values that differ, so a test has something to test
    per_case.write_text("case,class,dice,hd95_mm,ece,classwise_ece\n"
                        + "".join(f"c{i},1,{dice + 0.01 * i * (seed + 1)},1.0,0.1,0.1\n" for i in range(6)))


def test_rows_trained_on_different_rater_targets_are_never_compared(tmp_path):
    """The runs trained on one rater (eroded, staple) were selected and Wilcoxon-tested beside those trained on
    the majority, each scored against its own target's label: the ranking came out reversed. Runs whose label is
    the majority (majority, mean, random) stay comparable."""
    for seed in (0, 1):
        _target_run(tmp_path / f"ce{seed}", "ce", seed, 0.80, 0.50, None)
        _target_run(tmp_path / f"maj{seed}", "margin", seed, 0.81, 0.51, "majority")
        _target_run(tmp_path / f"mean{seed}", "margin", seed, 0.82, 0.52, "mean")
        _target_run(tmp_path / f"eroded{seed}", "margin", seed, 0.90, 0.90, "eroded")
        _target_run(tmp_path / f"staple{seed}", "margin", seed, 0.70, 0.95, "staple", recorded=False)
    rows = build_rows(collect_runs([tmp_path]), baseline="ce", n_boot=10)
    by = {(r.loss_name, r.configuration): r for r in rows}
    plain = by["ce", "loss=ce"].dataset
    assert by["margin", "dataset.raters.target=mean loss=margin"].dataset == plain
    assert by["margin", "dataset.raters.target=majority loss=margin"].dataset == plain
    eroded = by["margin", "dataset.raters.target=eroded loss=margin"]
    staple = by["margin", "dataset.raters.target=staple loss=margin"]  # told by its overrides alone
    assert len({plain, eroded.dataset, staple.dataset}) == 3
    assert "eroded" in eroded.dataset and "staple" in staple.dataset
    # selection and tests per reference: the majority's margin row is selected by its own validation, the
    # rows scored against another label are selected alone and tested against no baseline of another label
    assert by["margin", "dataset.raters.target=mean loss=margin"].selected
    assert eroded.selected and staple.selected
    assert eroded.cells["dice"].p_vs_baseline is None and staple.cells["dice"].p_vs_baseline is None
    assert by["margin", "dataset.raters.target=mean loss=margin"].cells["dice"].p_vs_baseline is not None


def test_every_evaluation_records_the_rater_target_it_scored(make_cfg, tmp_path):
    """The report reads the target from the evaluation's provenance (``dataset``, from ``dataset_identity``)."""
    from mcseg.data.build import build_dataset
    from mcseg.evaluation.provenance import dataset_identity

    from .fake_datasets import write_qubiq

    root = write_qubiq(tmp_path / "qubiq", n_train=2, n_val=1)
    cfg = make_cfg(["dataset=qubiq", f"dataset.root={root}", "dataset.raters.target=staple"])
    assert dataset_identity(build_dataset(cfg.dataset), [])["raters_target"] == "staple"


def _labels_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two reference folders of one name (``labels``) under paths that share their start, of other content."""
    import shutil

    import nibabel as nib
    import numpy as np

    from .test_monai_folders import _labels

    first = _labels(tmp_path / "ref_a" / "labels", (11, 9, 6))
    second = shutil.copytree(first, tmp_path / "ref_b" / "labels")
    img = nib.load(str(second / "case_0.nii.gz"))
    label = np.asarray(img.dataobj).copy()
    label[label == 2] = 1  # another reference: case_0 without its inner class
    nib.save(nib.Nifti1Image(label, img.affine), str(second / "case_0.nii.gz"))
    return first, second


FAST = ["--bootstrap-samples", "0", "--no-failure-detection", "--no-figures"]


def test_folder_evaluations_against_two_references_of_one_name_are_two_datasets(tmp_path):
    """The report labelled a folder evaluation's dataset by the first 8 characters of its reference's absolute
    path: two references merged into one dataset (selection and tests across them)."""
    from mcseg.evaluate_folder import main as evaluate_folder
    from mcseg.report.collect import collect_folder_evaluations

    from .tool_outputs import make_monai

    first, second = _labels_pair(tmp_path)
    pred = make_monai(tmp_path / "pred", first)
    assert evaluate_folder([str(pred), str(first), "-o", str(tmp_path / "evals/a"), *FAST]) == 0
    assert evaluate_folder([str(pred), str(second), "-o", str(tmp_path / "evals/b"), *FAST]) == 0
    rows = build_rows(collect_folder_evaluations([tmp_path / "evals"]), baseline=None, n_boot=10)
    assert len(rows) == 2 and len({r.dataset for r in rows}) == 2
    assert all(r.dataset.startswith("ref_a/labels") or r.dataset.startswith("ref_b/labels") for r in rows)


def test_of_two_evaluations_of_one_folder_the_one_of_its_current_files_is_reported(tmp_path, caplog):
    """A calibrated folder evaluated, its files then replaced (calibrated again) and evaluated again: the report
    kept the stale evaluation and dropped the current one as a duplicate seed."""
    import logging

    from mcseg.evaluate_folder import main as evaluate_folder
    from mcseg.report.collect import collect_folder_evaluations

    from .tool_outputs import make_monai

    labels, _ = _labels_pair(tmp_path)
    pred = make_monai(tmp_path / "calibrated", labels, seed=0)
    assert evaluate_folder([str(pred), str(labels), "-o", str(tmp_path / "evals/e1"), *FAST]) == 0
    make_monai(pred, labels, noise=3.0, seed=1)  # the folder's files replaced by other probabilities
    assert evaluate_folder([str(pred), str(labels), "-o", str(tmp_path / "evals/e2"), *FAST]) == 0
    current = json.loads((tmp_path / "evals/e2/summary.json").read_text())
    stale = json.loads((tmp_path / "evals/e1/summary.json").read_text())
    assert current["mean_ece"] != stale["mean_ece"]
    with caplog.at_level(logging.WARNING):
        records = collect_folder_evaluations([tmp_path / "evals"])
    rows = build_rows(records, baseline=None, n_boot=10)
    assert len(rows) == 1 and [r.path.name for r in rows[0].runs] == ["e2"]
    assert rows[0].cells["ece"].mean == current["mean_ece"]
    assert any("evals/e1" in r.message and "no longer hold" in r.message for r in caplog.records)


def _calibrated(tmp_path: Path, labels: Path, *extra: str) -> Path:
    """A MONAI folder calibrated by mcseg-calibrate-folder into ``tmp_path/cal`` (fitted on another folder of the
    same cases: --allow-fit-cases)."""
    from mcseg.calibrate_folder import main as calibrate

    from .tool_outputs import make_monai

    fit = tmp_path / "fit" if (tmp_path / "fit").is_dir() else make_monai(tmp_path / "fit", labels, noise=2.5, seed=2)
    test = tmp_path / "test" if (tmp_path / "test").is_dir() else make_monai(tmp_path / "test", labels, seed=3)
    assert calibrate(["--fit", str(fit), "--reference", str(labels), "--apply", str(test), "-o", str(tmp_path / "cal"),
                      "--allow-fit-cases", *extra]) == 0
    return tmp_path / "cal"


def test_a_lone_evaluation_of_a_folder_calibrated_again_is_not_reported_with_its_old_figures(tmp_path, caplog):
    """Issue 55: a calibrated folder evaluated once, then calibrated again with --overwrite: its one evaluation
    was reported with the figures of files that no longer exist (the check of the recorded sha256 ran only for
    folders evaluated twice or more). Now it is listed as left out (stale), with the command to run again."""
    import logging

    from mcseg.evaluate_folder import main as evaluate_folder
    from mcseg.report import cli
    from mcseg.report.collect import collect_folder_evaluations

    labels, _ = _labels_pair(tmp_path)
    cal = _calibrated(tmp_path, labels)
    assert evaluate_folder([str(cal), str(labels), "-o", str(tmp_path / "evals/e1"), *FAST]) == 0
    assert len(build_rows(collect_folder_evaluations([tmp_path / "evals"]), baseline=None, n_boot=10)) == 1
    _calibrated(tmp_path, labels, "--overwrite", "--scaler", "vector", "--voxels", "balanced")
    with caplog.at_level(logging.WARNING):
        records = collect_folder_evaluations([tmp_path / "evals"])
    assert build_rows(records, baseline=None, n_boot=10) == []
    (stale,) = records
    assert stale.status == "stale" and not stale.evaluated and "mcseg-evaluate-folder" in stale.error
    assert any("evals/e1" in r.message and "no longer hold" in r.message for r in caplog.records)
    assert cli.main([str(tmp_path / "evals"), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    left_out = (tmp_path / "report/report.md").read_text().split("## Runs left out")[1]
    assert "evals/e1 | stale |" in left_out


def test_an_evaluation_of_fit_cases_is_a_marked_report_row(tmp_path):
    """Issue 55: an evaluation of a folder calibrated with --allow-fit-cases records the fit cases it scored
    (``scored_fit_cases``), yet its report row was unmarked (``scores_seen_cases: False``)."""
    import csv

    from mcseg.evaluate_folder import main as evaluate_folder
    from mcseg.report import cli

    labels, _ = _labels_pair(tmp_path)
    cal = _calibrated(tmp_path, labels)
    assert evaluate_folder([str(cal), str(labels), "-o", str(tmp_path / "evals/e1"), *FAST]) == 0
    assert json.loads((tmp_path / "evals/e1/summary.json").read_text())["provenance"]["scored_fit_cases"]
    assert cli.main([str(tmp_path / "evals"), "--no-eval", "--out", str(tmp_path / "report")]) == 0
    (row,) = csv.DictReader(open(tmp_path / "report/report.csv"))
    assert row["scores_seen_cases"] == "True"
    text = (tmp_path / "report/report.md").read_text()
    assert "‡" in text and "calibration" in text


def _regions_json(path: Path) -> Path:
    path.write_text(json.dumps({"labels": {"background": 0, "whole": [1, 2], "inner": 2},
                                "regions_class_order": [1, 2]}))
    return path


def _monai_regions(root: Path, labels: Path) -> Path:
    """Sigmoid maps of the regions {1, 2} and {2} of each label, saved as MONAI's SaveImage saves them."""
    import nibabel as nib
    import numpy as np
    import torch
    from monai.data import MetaTensor
    from monai.transforms import SaveImage

    saver = SaveImage(output_dir=str(root), print_log=False)
    rng = np.random.default_rng(0)
    for path in sorted(labels.glob("*.nii.gz")):
        img = nib.load(str(path))
        label = np.asarray(img.dataobj).astype(np.int64)
        masks = np.stack([label >= 1, label == 2]).astype(np.float32) * 6 - 3
        probs = torch.sigmoid(torch.from_numpy(masks + rng.normal(size=masks.shape).astype(np.float32)))
        meta = {"original_affine": torch.as_tensor(img.affine), "filename_or_obj": str(path),
                "spatial_shape": label.shape}
        saver(MetaTensor(probs, affine=torch.as_tensor(img.affine), meta=meta))
    return root


def test_evaluations_against_labels_and_regions_of_one_folder_are_two_datasets(tmp_path):
    """Issue 55: the same label files scored as labels and as regions (another dataset.json) were one dataset of
    one label in the report: rows of different classes selected and tested together."""
    from mcseg.evaluate_folder import main as evaluate_folder
    from mcseg.report.collect import collect_folder_evaluations

    from .tool_outputs import make_monai

    labels, _ = _labels_pair(tmp_path)
    (labels / "dataset.json").unlink()  # the classes come from --dataset-json, outside the reference folder
    as_labels = tmp_path / "labels.json"
    as_labels.write_text(json.dumps({"labels": {"background": 0, "outer": 1, "inner": 2}}))
    softmax = make_monai(tmp_path / "softmax", labels)
    sigmoid = _monai_regions(tmp_path / "sigmoid", labels)
    assert evaluate_folder([str(softmax), str(labels), "-o", str(tmp_path / "evals/l"), "--dataset-json",
                            str(as_labels), *FAST]) == 0
    assert evaluate_folder([str(sigmoid), str(labels), "-o", str(tmp_path / "evals/r"), "--dataset-json",
                            str(_regions_json(tmp_path / "regions.json")), *FAST]) == 0
    rows = build_rows(collect_folder_evaluations([tmp_path / "evals"]), baseline=None, n_boot=10)
    assert len(rows) == 2 and len({r.dataset for r in rows}) == 2
    by = {r.runs[0].path.name: r for r in rows}
    assert "regions" in by["r"].dataset and "regions" not in by["l"].dataset
    assert by["r"].runs[0].dataset_key != by["l"].runs[0].dataset_key


def test_an_evaluation_whose_prediction_files_are_gone_is_reported_with_a_warning(tmp_path, caplog):
    """Files deleted after their evaluation (disk space) are not files of other content: the evaluation is reported
    as it was made, with a warning that its figures can no longer be checked."""
    import logging
    import shutil

    from mcseg.evaluate_folder import main as evaluate_folder
    from mcseg.report.collect import collect_folder_evaluations

    from .tool_outputs import make_monai

    labels, _ = _labels_pair(tmp_path)
    pred = make_monai(tmp_path / "pred", labels)
    assert evaluate_folder([str(pred), str(labels), "-o", str(tmp_path / "evals/e1"), *FAST]) == 0
    shutil.rmtree(pred)
    with caplog.at_level(logging.WARNING):
        rows = build_rows(collect_folder_evaluations([tmp_path / "evals"]), baseline=None, n_boot=10)
    assert len(rows) == 1 and rows[0].runs[0].status == "completed"
    assert any("evals/e1" in r.message and "are gone" in r.message for r in caplog.records)

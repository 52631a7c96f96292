"""scripts/peer_nnunet.py's file work on tiny files: an mcseg run's split in nnU-Net's layout (convert, splits) and
the table of the nnU-Net calibration study (table). nnU-Net itself is not needed (its npz and pkl are read by
mcseg-evaluate-folder --format nnunet: tests/test_nnunet_folders.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mcseg.data.reference import read_reference, task_from_labels
from tests import fake_datasets as fd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import peer_nnunet  # noqa: E402

SPLIT = {"train": ["case_000", "case_001"], "val": ["case_002"], "test": ["case_003", "case_004"]}
HIPPOCAMPUS_LABELS = {"0": "background", "1": "Anterior", "2": "Posterior"}


@pytest.fixture
def run_and_data(tmp_path):
    data = fd.write_msd(tmp_path / "data", n_cases=5, shape=(8, 8, 6), labels=HIPPOCAMPUS_LABELS)
    run = tmp_path / "run"
    run.mkdir()
    (run / "split.json").write_text(json.dumps(SPLIT))
    return run, data


def test_convert_links_the_runs_split_into_nnunets_layout_with_the_same_class_names(run_and_data, tmp_path):
    run, data = run_and_data
    work = tmp_path / "work"
    peer_nnunet.convert(run, data, work, 4)
    raw = work / "nnUNet_raw" / "Dataset004_Hippocampus"
    trained = SPLIT["train"] + SPLIT["val"]
    assert sorted(p.name for p in (raw / "imagesTr").iterdir()) == [f"{c}_0000.nii.gz" for c in trained]
    assert sorted(p.name for p in (raw / "labelsTr").iterdir()) == [f"{c}.nii.gz" for c in trained]
    assert sorted(p.name for p in (raw / "imagesTs").iterdir()) == [f"{c}_0000.nii.gz" for c in SPLIT["test"]]
    assert sorted(p.name for p in (work / "labelsTs").glob("*.nii.gz")) == [f"{c}.nii.gz" for c in SPLIT["test"]]
    assert (raw / "imagesTr" / "case_001_0000.nii.gz").resolve() == (data / "imagesTr" / "case_001.nii.gz").resolve()
    assert (work / "labelsTs" / "case_004.nii.gz").resolve() == (data / "labelsTr" / "case_004.nii.gz").resolve()
    dataset = json.loads((raw / "dataset.json").read_text())
    assert dataset == {"channel_names": {"0": "MRI"}, "labels": {"background": 0, "anterior": 1, "posterior": 2},
                       "numTraining": 3, "file_ending": ".nii.gz"}
    # mcseg-evaluate-folder reads the test labels with the class names nnU-Net's dataset.json gives its folders
    theirs = task_from_labels(dataset["labels"], raw / "dataset.json")
    ours = read_reference(work / "labelsTs").task
    assert ours == theirs and ours.class_names == ["background", "anterior", "posterior"]
    peer_nnunet.convert(run, data, work, 4)  # again: the links are replaced, not refused
    assert (raw / "labelsTr" / "case_000.nii.gz").is_symlink()


def test_convert_refuses_a_split_naming_a_case_the_data_lacks(run_and_data, tmp_path):
    run, data = run_and_data
    (run / "split.json").write_text(json.dumps({**SPLIT, "test": ["case_009"]}))
    with pytest.raises(SystemExit, match=r"case_009.nii.gz: missing \(the run's split names a case"):
        peer_nnunet.convert(run, data, tmp_path / "work", 4)
    (run / "split.json").write_text(json.dumps({**SPLIT, "val": []}))
    with pytest.raises(SystemExit, match=r"split.json: no val cases"):
        peer_nnunet.convert(run, data, tmp_path / "work", 4)


def test_splits_is_one_fold_of_the_runs_training_and_validation_cases(run_and_data, tmp_path):
    run, _ = run_and_data
    peer_nnunet.splits(run / "split.json", tmp_path / "pre")
    assert json.loads((tmp_path / "pre" / "splits_final.json").read_text()) == [
        {"train": SPLIT["train"], "val": SPLIT["val"]}]


def _summary(dice: float, ece: float, temperature: dict | None = None) -> dict:
    summary = {"mean_foreground_dice": dice, "mean_foreground_hd95_mm": 2.0 + dice, "mean_ece": ece,
               "mean_classwise_ece": ece / 2, "mean_nll": 3 * ece, "mean_brier": ece / 3,
               "failure_detection": {"predictive_entropy": {"image": {"aurc": 0.1, "eaurc": 0.05, "augrc": 0.02},
                                                            "ueo": 0.4, "voxel_auroc_pooled": 0.7},
                                     "mutual_information": {"voxel_auroc_pooled": 0.6}}}
    if temperature is not None:
        summary["posthoc"] = {"temperature": temperature}
    return summary


def test_table_puts_the_mcseg_run_beside_nnunets_validation_and_test(tmp_path):
    scaled = {"mean_foreground_dice": 0.8, "mean_foreground_hd95_mm": 2.8, "mean_ece": 0.02,
              "mean_classwise_ece": 0.01, "mean_nll": 0.06, "mean_brier": 0.007}
    for name, summary in (("mcseg", _summary(0.8, 0.05, scaled)), ("validation", _summary(0.85, 0.03)),
                          ("test", _summary(0.84, 0.04))):  # no test_temperature yet: its row is left out
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "budget.json").write_text(json.dumps({"epochs": 30, "iterations_per_epoch": 50}))
    text = peer_nnunet.table(tmp_path)
    assert (tmp_path / "table.md").read_text() == text
    rows = [line.split(" | ") for line in text.splitlines()[2:]]
    nnunet = "nnU-Net v2 3d_fullres, 30 epochs of 50 iterations"
    assert [(r[0].lstrip("| "), r[1]) for r in rows] == [
        ("mcseg, experiment=hippocampus_cpu", "test"),
        ("mcseg, experiment=hippocampus_cpu", "test + T (its validation)"),
        (nnunet, "validation (fold 0, its own)"), (nnunet, "test")]
    header = text.splitlines()[0].split(" | ")
    assert [r[header.index("ECE")] for r in rows] == ["0.050", "0.020", "0.030", "0.040"]
    assert [r[header.index("Dice")] for r in rows] == ["0.800", "0.800", "0.850", "0.840"]
    assert [r[header.index("AUROC")] for r in rows] == ["0.700", "–", "0.700", "0.700"]  # scaled: not re-measured

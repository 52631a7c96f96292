"""Issue #44: another tool's folder goes through the per-case code of a checkpoint's evaluation (the protocol's
failure-detection settings included), and a prediction format or a post-hoc calibrator is one class plus one
entry of one list."""
from __future__ import annotations

import csv
import json

import nibabel as nib
import numpy as np
import pytest
import torch

from mcseg.evaluate_folder import evaluate_folder
from mcseg.evaluation.evaluator import EvalProtocol
from tests.test_monai_folders import _labels
from tests.tool_outputs import make_monai


@pytest.fixture(scope="module")
def monai(tmp_path_factory):
    root = tmp_path_factory.mktemp("extension")
    labels = _labels(root / "labels", (11, 9, 6))
    return labels, make_monai(root / "pred", labels, noise=3.0)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_folder_evaluation_follows_the_protocols_failure_region_risk_and_bootstrap(monai, tmp_path):
    """On main the folder evaluation built ``FailureDetection(MAPS)``: evaluation.failure_risk=micro,
    failure_region and bootstrap_samples were ignored (macro risk, the calibration region, 1000 resamples)."""
    from mcseg.metrics.failure import micro_foreground_dice

    labels, pred = monai
    protocol = EvalProtocol(failure_risk="micro", failure_region="all", bootstrap_samples=7, figures=False)
    summary = evaluate_folder(pred, labels, protocol=protocol, output_dir=tmp_path / "out")
    detection = summary["failure_detection"]["protocol"]
    assert detection["risk_definition"] == "micro" and detection["voxel_region"] == "all"
    assert "7 resamples" in detection["rc_ci95"]
    rows = _rows(tmp_path / "out" / "failure_per_case.csv")
    assert {r["risk_definition"] for r in rows} == {"micro"} and {r["voxel_region"] for r in rows} == {"all"}
    for row in rows:  # the risk is 1 - the micro foreground Dice of the arg-max
        case = row["case"]
        label = torch.from_numpy(np.asarray(nib.load(str(labels / f"{case}.nii.gz")).dataobj).astype(np.int64))
        probs = np.asarray(nib.load(str(pred / case / f"{case}_trans.nii.gz")).dataobj)
        argmax = torch.from_numpy(np.moveaxis(probs, -1, 0).argmax(0))
        assert float(row["risk"]) == pytest.approx(1.0 - micro_foreground_dice(argmax, label, False), abs=1e-6)

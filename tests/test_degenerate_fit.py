"""A degenerate post-hoc fit (issue #43): a temperature so large that every voxel gets the uniform prediction
(the uncertainty study's "CE, MC dropout (10) + T": T = 3.3e5, NLL = ln 3) says so itself, in the log, in
calibration.json and in the report's rows."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mcseg.calibration import PosthocConfig, fit_posthoc
from mcseg.data.cases import CaseData
from mcseg.report.table import add_predictors


def _fit(tmp_path: Path, logits: torch.Tensor, label: torch.Tensor) -> dict:
    predictor = SimpleNamespace(model=torch.nn.Identity(), eval=lambda: None, multilabel=False,
                                link=lambda z: z.softmax(1), logits=lambda case: logits)
    case = CaseData(case_id="c0", image=logits.numpy(), label=label.numpy(), spacing=(1.0, 1.0), affine=np.eye(4))
    # balanced voxels: this fake predictor has no label map to pick the region with
    return fit_posthoc(predictor, [case], PosthocConfig(fit=["temperature"], apply=[], voxels="balanced"),
                       tmp_path, {"sha256": "0" * 64, "path": "x.pt"})


def _label() -> torch.Tensor:
    label = torch.zeros(8, 8, dtype=torch.long)
    label[2:6, 2:6] = 1
    return label


def test_a_fit_that_ends_at_the_uniform_prediction_is_flagged_degenerate(tmp_path, caplog):
    """Confident and always wrong: the NLL-optimal temperature is unbounded and the fit ends at the uniform
    prediction (NLL = ln 3); it is kept, but flagged in the record, in calibration.json and in the log."""
    label = _label()
    logits = torch.zeros(3, 8, 8)
    logits[2] = 10.0  # class 2, which no voxel has
    with caplog.at_level(logging.WARNING):
        record = _fit(tmp_path, logits, label)
    fit = record["scalers"]["temperature"]
    assert fit["nll_after"] == pytest.approx(math.log(3), abs=1e-4)
    assert fit["degenerate"] is True and "uniform" in fit["degenerate_reason"]
    stored = json.loads((tmp_path / "calibration.json").read_text())["fits"]["0" * 64]
    assert stored["scalers"]["temperature"]["degenerate"] is True
    assert any("degenerate" in w for w in stored["warnings"]) and "degenerate" in caplog.text


def test_a_fit_far_from_the_uniform_prediction_is_flagged_by_its_temperature_alone(tmp_path, caplog):
    """The temperature bound alone: right voxels with margin 1100 and wrong ones whose logit for a class no voxel
    has is 20 pull the NLL-optimal temperature to about 150, beyond DEGENERATE_TEMPERATURE's 100, while the
    fitted NLL (about 0.18) stays far below the uniform prediction's ln 3. Flagged for the temperature, not the
    NLL, in the record, calibration.json and the log."""
    from mcseg.calibration.posthoc import DEGENERATE_TEMPERATURE

    label = _label()
    logits = torch.zeros(3, 8, 8)
    logits[0][label == 0], logits[1][label == 1] = 1100.0, 1100.0
    wrong = torch.zeros(8, 8, dtype=torch.bool)
    wrong[0], wrong[3, 2:4] = True, True
    logits[:, wrong] = 0.0
    logits[2][wrong] = 20.0
    with caplog.at_level(logging.WARNING):
        record = _fit(tmp_path, logits, label)
    fit = record["scalers"]["temperature"]
    assert DEGENERATE_TEMPERATURE[1] < fit["temperature"] < 200 and fit["nll_after"] < math.log(3) - 0.5
    assert fit["degenerate"] is True and "uniform" not in fit["degenerate_reason"]
    assert fit["degenerate_reason"] == f"T={fit['temperature']:.4g} outside {DEGENERATE_TEMPERATURE}"
    stored = json.loads((tmp_path / "calibration.json").read_text())["fits"]["0" * 64]
    assert stored["scalers"]["temperature"]["degenerate"] is True
    assert any("degenerate fit (T=" in w for w in stored["warnings"]) and "degenerate fit (T=" in caplog.text


@pytest.mark.parametrize(("temperature", "flagged"), [(0.009, True), (0.011, False), (99.0, False), (150.0, True)])
def test_either_temperature_bound_flags_a_fit_whose_nll_is_far_from_uniform(temperature, flagged):
    from mcseg.calibration.posthoc import degenerate_reason

    reason = degenerate_reason({"temperature": temperature, "nll_after": 0.2}, 3, False)
    assert (reason is not None) is flagged
    assert not flagged or reason.startswith(f"T={temperature:.4g} outside")


def test_a_sound_fit_gets_no_degenerate_field(tmp_path):
    """A temperature near 1 on a reasonable prediction: the record holds what a sound fit holds, no degenerate key."""
    label = _label()
    predicted = label.clone()
    predicted[2, 2:4] = 0  # a few wrong voxels in the foreground and in the background
    predicted[0, :2] = 1
    logits = 2.0 * torch.stack([predicted == 0, predicted == 1]).float()
    record = _fit(tmp_path, logits, label)
    fit = record["scalers"]["temperature"]
    assert 0.5 < fit["temperature"] < 5
    assert set(fit) == {"temperature", "nll_before", "nll_after", "voxels", "n_voxels", "n_cases", "objective",
                        "argmax_changes", "guarantee", "fit_seconds"}  # since issue #45: fit voxels that changed
    # class, what it keeps, and how long the fit took (wall seconds, every scaler alike)
    assert fit["fit_seconds"] > 0
    assert fit["argmax_changes"]["count"] == 0
    assert not record["warnings"]


def test_the_report_marks_a_predictor_scaled_by_a_degenerate_fit():
    def summary(degenerate: bool) -> dict:
        params = {"temperature": 3.3e5 if degenerate else 1.2, **({"degenerate": True} if degenerate else {})}
        return {"mean_foreground_dice": 0.8, "mean_ece": 0.2,
                "posthoc": {"temperature": {"params": params, "mean_foreground_dice": 0.8, "mean_ece": 0.1}}}

    run = SimpleNamespace(path=Path("run0"), summaries={"": summary(False)}, shift={},
                          variants={"MC dropout (10)": summary(True)})
    row = SimpleNamespace(runs=[run])
    add_predictors([row], [])
    assert "single + T" in row.predictors
    assert "MC dropout (10)" in row.predictors
    assert "MC dropout (10) + T (pooled) (degenerate fit)" in row.predictors


"""Post-hoc scalers wired into training, evaluate.py and the report (issue #14 items 1-3):
fit voxels of the calibration region, the ECE objective, local temperature scaling end to end."""
from __future__ import annotations

import csv
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mcseg.calibration import PosthocConfig
from mcseg.calibration.posthoc import collect_validation
from mcseg.calibration.scaler_registry import FitData, FitOptions, build_scaler
from mcseg.calibration.logit_scaling import fit_temperature_ece, voxel_ece
from mcseg.config import EvalProtocol
from mcseg.data.cases import CaseData
from mcseg.evaluation.evaluator import Evaluator
from mcseg.errors import ConfigError
from tests.conftest import TINY_2D
from tests.test_calibration import calibrated_logits, softmax_link
from tests.test_posthoc_scalers import smooth_logits

K, SHAPE, SPACING = 3, (24, 20), (1.0, 1.5)


def fake_cases(n: int, t: float, seed: int = 0) -> tuple[list[CaseData], dict[str, torch.Tensor]]:
    """Cases of a calibrated model (labels drawn from softmax(z*)) seen through logits t z*, and those logits."""
    g = torch.Generator().manual_seed(seed)
    cases, logits = [], {}
    for i in range(n):
        z_star = smooth_logits(K, SHAPE, g, std=3.0)
        y = torch.multinomial(torch.softmax(z_star, 0).movedim(0, -1).reshape(-1, K), 1, generator=g).reshape(SHAPE)
        cases.append(CaseData(f"c{i}", np.zeros((1, *SHAPE), np.float32), y.numpy(), SPACING, np.eye(4)))
        logits[f"c{i}"] = z_star * t
    return cases, logits


def fake_predictor(logits: dict[str, torch.Tensor]) -> SimpleNamespace:
    """The parts of a SegmentationPredictor the fit uses: logits of a case, link, label map."""
    return SimpleNamespace(
        model=torch.nn.Identity(), eval=lambda: None, multilabel=False, link=softmax_link, model_dims=2,
        roi_size=list(SHAPE), slice_axis=-1, logits=lambda case: logits[case.case_id],
        probabilities=lambda z: torch.softmax(z, 0), label_map=lambda p: p.argmax(0).to(torch.uint8))


def pooled_region_ece(cases, logits, protocol, temperature: float = 1.0) -> tuple[float, int]:
    """The evaluator's pooled ECE (and region voxel count) of the cases after dividing the logits by T."""
    evaluator = Evaluator(K, ["bg", "a", "b"], protocol)
    for case in cases:
        evaluator.add_case(case.case_id, torch.softmax(logits[case.case_id] / temperature, 0),
                           torch.as_tensor(case.label), case.spacing)
    pooled = evaluator.pooled_values()
    return pooled["ece"], pooled["n_voxels"]


@pytest.mark.parametrize("region", ["union_foreground", "label_foreground", "boundary", "all"])
def test_region_voxels_are_exactly_the_scored_region(region):
    cases, logits = fake_cases(3, 1.5)
    protocol = EvalProtocol(region=region, boundary_width_mm=1.5)
    data = collect_validation(fake_predictor(logits), cases, PosthocConfig(fit=["temperature"], apply=["temperature"], voxels="region"), protocol)
    _, n_scored = pooled_region_ece(cases, logits, protocol)
    assert len(data.logits) == n_scored > 0  # the evaluator's region, voxel for voxel
    if region == "all":
        assert n_scored == 3 * math.prod(SHAPE)
    # the same voxels, not just as many: the sampled logits are those of the region's voxels
    c = cases[0]
    one = collect_validation(fake_predictor(logits), [c], PosthocConfig(fit=["temperature"], apply=["temperature"], voxels="region"), protocol)
    z = logits[c.case_id]
    label = torch.as_tensor(c.label)
    pred = z.argmax(0)
    expected = {"union_foreground": (label > 0) | (pred > 0), "label_foreground": label > 0,
                "all": torch.ones_like(label, dtype=torch.bool)}.get(region)
    if expected is not None:
        torch.testing.assert_close(one.logits, z.reshape(K, -1).T[expected.reshape(-1)])
        assert torch.equal(one.target, label.reshape(-1)[expected.reshape(-1)])


def test_region_sample_is_capped_uniformly_inside_the_region():
    cases, logits = fake_cases(2, 1.0)
    protocol = EvalProtocol(region="label_foreground")
    full = collect_validation(fake_predictor(logits), cases, PosthocConfig(fit=["temperature"], apply=["temperature"], voxels="region"), protocol)
    capped = collect_validation(fake_predictor(logits), cases, PosthocConfig(fit=["temperature"], apply=["temperature"], voxels="region", max_voxels=50), protocol)
    assert len(capped.logits) == 50 and bool((capped.target > 0).all())  # only region (foreground) voxels
    rows = {tuple(r) for r in full.logits.tolist()}
    assert all(tuple(r) in rows for r in capped.logits.tolist())


@pytest.mark.parametrize("true_t", [2.0, 0.6])
def test_ece_objective_recovers_a_known_temperature(true_t):
    z, y = calibrated_logits(100_000, 4, seed=1)
    fitted = fit_temperature_ece(z * true_t, y, softmax_link, n_bins=15)
    assert fitted["temperature"] == pytest.approx(true_t, rel=0.05)
    assert fitted["ece_after"] < 0.01 < fitted["ece_before"]
    again = fit_temperature_ece(z * true_t, y, softmax_link, n_bins=15)
    assert again == fitted  # deterministic


def test_ece_objective_recovers_a_known_temperature_of_sigmoid_regions():
    g = torch.Generator().manual_seed(3)
    z = 2.0 * torch.randn(60_000, 2, generator=g)
    y = torch.bernoulli(torch.sigmoid(z), generator=g)  # two calibrated regions
    fitted = fit_temperature_ece(z * 2.5, y, torch.sigmoid, multilabel=True, n_bins=15)
    assert fitted["temperature"] == pytest.approx(2.5, rel=0.05)
    assert fitted["ece_after"] < 0.01 < fitted["ece_before"]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["nll", "ece"])
@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.0])
def test_region_fitted_temperature_never_raises_the_fit_regions_ece(objective, true_t):
    """Fitted on the region's voxels, TS does not raise the evaluator's ECE of that region beyond binning noise
    (the ECE objective: not at all, and its own ECE is the evaluator's)."""
    cases, logits = fake_cases(12, true_t, seed=2)
    protocol = EvalProtocol()  # union_foreground, 15 bins
    cfg = PosthocConfig(fit=["temperature"], apply=["temperature"], voxels="region", objective=objective)
    data = collect_validation(fake_predictor(logits), cases, cfg, protocol)
    scaler = build_scaler("temperature", FitOptions(objective=objective, n_bins=protocol.n_bins))
    record = scaler.fit(FitData((data.logits, data.target), sample={"voxels": "region"}))
    before, n = pooled_region_ece(cases, logits, protocol)
    after, _ = pooled_region_ece(cases, logits, protocol, record["temperature"])
    noise = math.sqrt(protocol.n_bins / n)  # about the ECE of a calibrated model from finite bins
    assert after <= before + (0 if objective == "ece" else noise)
    if true_t != 1.0:
        assert after < before - 0.01  # and it does calibrate
    if objective == "ece":
        assert record["ece_after"] == pytest.approx(after, abs=1e-9)
        assert record["ece_before"] == pytest.approx(before, abs=1e-9)
        assert voxel_ece(softmax_link(data.logits), data.target, False, 15) == pytest.approx(before, abs=1e-9)


def test_posthoc_config_refuses_what_it_cannot_fit():
    with pytest.raises(ConfigError, match="posthoc.objective"):
        PosthocConfig(fit=["temperature", "vector"], objective="ece")
    with pytest.raises(ConfigError, match="posthoc.objective"):
        PosthocConfig(fit=["lts"], objective="ece")
    with pytest.raises(ConfigError, match="'posthoc.voxels'=region: 'vector' scaling can change the arg-max"):
        PosthocConfig(fit=["temperature", "vector"], voxels="region")
    PosthocConfig(fit=["temperature", "lts"], voxels="region")  # both keep the arg-max (LTS fits on whole cases)
    with pytest.raises(ConfigError, match="posthoc.lts.learning_rate"):
        PosthocConfig(lts={"learning_rate": 0.1})
    with pytest.raises(ConfigError, match="posthoc.lts"):
        PosthocConfig(fit=["lts"], lts={"patch_size": [8, 8, 8]}).lts_config(2, [16, 16], -1)
    cfg = PosthocConfig(fit=["lts"], lts={"dims": None, "lr": 0.5})
    lts = cfg.lts_config(2, [16, 12], 0)  # unset geometry: the model's
    assert (lts.dims, lts.patch_size, lts.slice_axis, lts.lr) == (2, [16, 12], 0, 0.5)


def _per_case(path):
    with open(path, newline="") as f:
        return [(r["case"], r["class_name"], r["dice"], r["hd95_mm"]) for r in csv.DictReader(f)]


LTS_RUN = TINY_2D + ["dataset.split.val_fraction=0.3", "trainer.val_max_cases=3", "posthoc.fit=[temperature,lts]",
                     "posthoc.apply=[temperature,lts]", "posthoc.voxels=region", "posthoc.lts.max_epochs=2",
                     "posthoc.lts.steps_per_epoch=3", "posthoc.lts.patience=1"]


def test_training_fits_and_applies_lts_and_evaluate_reuses_it(make_cfg, tmp_path, one_thread):
    from mcseg.evaluate import evaluate
    from mcseg.report.collect import collect_runs
    from mcseg.report.render import markdown
    from mcseg.report.table import DEGENERATE_MARK, build_rows
    from mcseg.train import train

    result = train(make_cfg(LTS_RUN))
    run = tmp_path / "run"
    (sha, record), = json.loads((run / "calibration.json").read_text())["fits"].items()
    temperature, lts = record["scalers"]["temperature"], record["scalers"]["lts"]
    assert (temperature["voxels"], temperature["region"], temperature["objective"]) == ("region", "union_foreground",
                                                                                        "nll")
    assert temperature["n_voxels"] == record["n_voxels"] > 0
    assert (lts["voxels"], lts["objective"], lts["weights"]) == ("cases", "nll", f"lts-{sha[:8]}.pt")
    weights = run / lts["weights"]
    assert weights.is_file()
    raw, after = run / "eval" / "test", run / "eval" / "test" / "lts"
    assert (raw / "temperature" / "summary.json").is_file() and (after / "summary.json").is_file()
    # LTS keeps the arg-max: Dice and HD95 of every case and class are those of the raw outputs
    assert _per_case(after / "per_case.csv") == _per_case(raw / "per_case.csv")
    summary = json.loads((raw / "summary.json").read_text())
    assert summary["posthoc"]["lts"]["label"].startswith("lts (2D")
    assert summary["posthoc"]["temperature"]["label"] == "temperature (region, nll)"
    assert "test_lts/mean_ece" in result

    # evaluate.py applies the saved LTS to another split without refitting
    stamp = (weights.stat().st_mtime_ns, (run / "calibration.json").read_text())
    evaluate(make_cfg([f"ckpt={run / 'checkpoints' / 'best.pt'}", "split=val", "posthoc.apply=[lts]"],
                      config_name="evaluate", output_dir=tmp_path / "eval_job"))
    assert (weights.stat().st_mtime_ns, (run / "calibration.json").read_text()) == stamp
    val_raw, val_lts = run / "eval" / "val", run / "eval" / "val" / "lts"
    assert _per_case(val_lts / "per_case.csv") == _per_case(val_raw / "per_case.csv")

    # the report shows a row per scaler, labelled with how it was fitted
    rows = build_rows(collect_runs([run]), baseline=None, n_boot=10)
    text = markdown(rows, "t", [])
    mark = DEGENERATE_MARK if temperature.get("degenerate") else ""  # this tiny run's T is ~1e6: marked (issue #43)
    assert "| none (pre_T) |" in text and f"| temperature (region, nll){mark} |" in text and "| lts (2D, nll) |" in text


def test_lts_with_fewer_than_two_validation_cases_is_refused_at_start(make_cfg, tmp_path, one_thread):
    from mcseg.train import train

    with pytest.raises(ConfigError, match="posthoc.fit.*lts.*2 validation cases"):
        train(make_cfg(TINY_2D + ["posthoc.fit=[temperature,lts]", "posthoc.apply=[temperature]"]))
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training


def test_bad_lts_settings_are_refused_before_training(make_cfg, tmp_path, one_thread):
    from mcseg.train import train

    with pytest.raises(ConfigError, match="posthoc.lts.*patch_size"):
        train(make_cfg(LTS_RUN + ["posthoc.lts.patch_size=[8,8,8]"]))  # a 3D patch for the 2D model
    assert not (tmp_path / "run" / "checkpoints").exists()

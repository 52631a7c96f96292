"""Post-hoc calibration: temperature and vector scaling (mcseg.calibration)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mcseg.calibration import PosthocConfig, fit_scaler, nll, scale_logits
from mcseg.errors import ConfigError
from tests.conftest import TINY_2D


def softmax_link(z: torch.Tensor) -> torch.Tensor:
    return torch.softmax(z, dim=1)


def calibrated_logits(n: int, k: int, seed: int, spread: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels drawn from softmax(logits): a perfectly calibrated model by construction."""
    g = torch.Generator().manual_seed(seed)
    z = spread * torch.randn(n, k, generator=g)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return z, y


@pytest.mark.parametrize("true_t", [3.0, 0.5])
def test_temperature_recovers_a_known_temperature(true_t):
    z, y = calibrated_logits(200_000, 4, seed=0)
    fitted = fit_scaler("temperature", z * true_t, y, softmax_link)
    assert fitted["temperature"] == pytest.approx(true_t, rel=0.03)
    assert fitted["nll_after"] < fitted["nll_before"]


def test_temperature_matches_a_grid_search_of_the_nll():
    """Independent formulation: the NLL minimiser over a fine grid of T (numpy, float64)."""
    z, y = calibrated_logits(50_000, 3, seed=1)
    z = z * 2.2
    grid = np.linspace(1.5, 3.0, 301)
    zn, yn = z.double().numpy(), y.numpy()

    def nll_at(t):
        s = zn / t
        s = s - s.max(1, keepdims=True)
        return float(np.mean(np.log(np.exp(s).sum(1)) - s[np.arange(len(yn)), yn]))

    best = grid[np.argmin([nll_at(t) for t in grid])]
    fitted = fit_scaler("temperature", z, y, softmax_link)
    assert fitted["temperature"] == pytest.approx(best, abs=0.01)
    assert fitted["nll_after"] == pytest.approx(nll_at(fitted["temperature"]), rel=1e-4)


@pytest.mark.parametrize("kind", ["temperature", "vector"])
@pytest.mark.parametrize("seed", range(4))
def test_scaling_never_worsens_the_nll_it_was_fitted_on(kind, seed):
    g = torch.Generator().manual_seed(seed)
    n, k = 2000, 3
    z = torch.randn(n, k, generator=g) * (0.1 + 5 * seed)
    y = torch.randint(0, k, (n,), generator=g)  # labels unrelated to the logits for some seeds
    fitted = fit_scaler(kind, z, y, softmax_link)
    assert fitted["nll_after"] <= fitted["nll_before"] + 1e-7
    params = {key: v for key, v in fitted.items() if not key.startswith("nll")}
    recomputed = float(nll(softmax_link(scale_logits(z, params)), y, False))
    assert recomputed == pytest.approx(fitted["nll_after"], rel=1e-5)


def test_an_already_calibrated_model_keeps_t_near_one():
    z, y = calibrated_logits(100_000, 5, seed=2)
    assert fit_scaler("temperature", z, y, softmax_link)["temperature"] == pytest.approx(1.0, abs=0.03)


def test_vector_scaling_recovers_per_class_scales_and_beats_temperature():
    z, y = calibrated_logits(200_000, 3, seed=3)
    w_true = torch.tensor([0.5, 1.0, 2.0])
    observed = z / w_true  # class-dependent miscalibration: one T cannot undo it
    vector = fit_scaler("vector", observed, y, softmax_link)
    temperature = fit_scaler("temperature", observed, y, softmax_link)
    assert vector["weight"] == pytest.approx(w_true.tolist(), rel=0.05)
    assert vector["nll_after"] < temperature["nll_after"]
    true_nll = float(nll(softmax_link(z), y, False))
    assert vector["nll_after"] == pytest.approx(true_nll, abs=2e-3)


def test_multilabel_temperature_with_a_sigmoid_link():
    g = torch.Generator().manual_seed(4)
    z = 2 * torch.randn(100_000, 2, generator=g)
    y = torch.bernoulli(torch.sigmoid(z), generator=g)
    fitted = fit_scaler("temperature", 2.5 * z, y, torch.sigmoid, multilabel=True)
    assert fitted["temperature"] == pytest.approx(2.5, rel=0.04)


def test_scale_logits_on_any_channel_axis():
    z = torch.randn(3, 4, 5)
    params = {"weight": [1.0, 2.0, 3.0], "bias": [0.0, 1.0, -1.0]}
    out = scale_logits(z, params, channel_dim=0)
    assert torch.allclose(out[1], 2 * z[1] + 1) and torch.allclose(out[2], 3 * z[2] - 1)
    assert torch.allclose(scale_logits(z, {"temperature": 2.0}), z / 2)


def test_bad_scaler_names_and_shapes_are_clear_errors():
    with pytest.raises(ConfigError, match="posthoc.apply"):
        PosthocConfig(apply=["platt"])
    with pytest.raises(ValueError, match="N x K"):
        fit_scaler("temperature", torch.zeros(0, 3), torch.zeros(0), softmax_link)
    with pytest.raises(ValueError, match="expected one of"):
        fit_scaler("matrix", torch.zeros(4, 3), torch.zeros(4), softmax_link)


@pytest.mark.slow
def test_training_fits_on_validation_and_reports_pre_and_post_t(make_cfg, tmp_path, one_thread):
    from mcseg.evaluate import evaluate
    from mcseg.train import train

    cfg = make_cfg(TINY_2D)
    result = train(cfg)
    run = tmp_path / "run"
    (record,) = json.loads((run / "calibration.json").read_text())["fits"].values()  # keyed by best.pt's sha256
    assert record["fitted_on"] == "val" and record["checkpoint"]["path"] == str(run / "checkpoints" / "best.pt")
    assert set(record["scalers"]) == {"temperature"}  # the default since the study of docs/results.md
    assert record["scalers"]["temperature"]["voxels"] == "region"
    for scaler in record["scalers"].values():
        assert scaler["nll_after"] <= scaler["nll_before"]
    summary = json.loads((run / "eval" / "test" / "summary.json").read_text())
    post = json.loads((run / "eval" / "test" / "temperature" / "summary.json").read_text())
    # temperature scaling keeps the argmax: same Dice, different calibration
    assert post["mean_foreground_dice"] == pytest.approx(summary["mean_foreground_dice"])
    assert summary["posthoc"]["temperature"]["mean_ece"] == pytest.approx(post["mean_ece"])
    assert result["test_temperature/mean_ece"] == pytest.approx(post["mean_ece"])
    assert post["posthoc"]["params"]["temperature"] == pytest.approx(record["scalers"]["temperature"]["temperature"])

    # evaluate.py refits on request (here by another objective) and writes the same layout for another
    # split; the run's own fit, which its test evaluation used, stays on record as it was: the refit is
    # kept with the evaluation that asked for it
    def evaluate_val(*extra):
        return evaluate(make_cfg([f"ckpt={run / 'checkpoints' / 'best.pt'}", "split=val", *extra],
                                 config_name="evaluate", output_dir=tmp_path / "eval_job"))

    fit_on_record = (run / "calibration.json").read_bytes()
    evaluate_val("posthoc.apply=[temperature]", "posthoc.refit=true", "posthoc.fit=[temperature]", "posthoc.objective=ece")
    assert (run / "calibration.json").read_bytes() == fit_on_record
    assert not (run / "eval" / "val" / "vector").exists()
    (refit,) = json.loads((run / "eval" / "val" / "calibration.json").read_text())["fits"].values()
    t_run, t_refit = (r["scalers"]["temperature"]["temperature"] for r in (record, refit))
    assert refit["scalers"]["temperature"]["objective"] == "ece" and t_refit != pytest.approx(t_run, rel=1e-3)
    applied = lambda: json.loads((run / "eval" / "val" / "temperature" / "summary.json").read_text())["posthoc"]
    assert applied()["params"]["temperature"] == pytest.approx(t_refit)
    # evaluated again without refit (replacing that evaluation): the fit on record, and the refit is gone
    evaluate_val("overwrite=true")
    assert applied()["params"]["temperature"] == pytest.approx(t_run)
    assert not (run / "eval" / "val" / "calibration.json").exists()
    with pytest.raises(ConfigError, match=r"config key 'eval_dir'=.* is the run directory"):
        evaluate_val(f"eval_dir={run}")
    # an unreadable record is named, and a refit (the way out it names) leaves it as it is
    (run / "calibration.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"calibration\.json: not valid JSON.*posthoc\.refit=true"):
        evaluate_val("overwrite=true")
    evaluate_val("overwrite=true", "posthoc.refit=true")
    assert (run / "calibration.json").read_text() == "{not json"
    assert applied()["params"]["temperature"] == pytest.approx(t_run, rel=1e-4)  # the run's settings, refitted


def test_apply_without_fit_is_a_config_error(make_cfg):
    from mcseg.train import train

    with pytest.raises(ConfigError, match="posthoc.apply"):
        train(make_cfg(TINY_2D + ["posthoc.fit=[temperature]", "posthoc.apply=[vector]"]))


@pytest.mark.parametrize("multilabel", [False, True])
def test_voxel_samples_balanced_or_every_voxel(multilabel):
    from mcseg.calibration.posthoc import _sample_voxels

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 10, 10)
    if multilabel:
        label = torch.zeros(2, 10, 10, dtype=torch.uint8)
        label[0, :3, :4] = 1  # 12 foreground voxels
    else:
        label = torch.zeros(10, 10, dtype=torch.long)
        label[:3, :4] = 1
    z, y = _sample_voxels(logits, label, multilabel, g, "balanced")
    fg = y.any(1) if multilabel else y > 0
    assert len(z) == 24 and int(fg.sum()) == 12  # every foreground voxel and as many background ones
    z, y = _sample_voxels(logits, label, multilabel, g, "all")
    assert len(z) == 100 and torch.equal(z[:, 0], logits[0].flatten())
    with pytest.raises(ConfigError, match="posthoc.voxels"):
        PosthocConfig(voxels="foreground")

"""Histogram binning and isotonic regression as post-hoc scalers (mcseg/calibration/binning_adapters.py), and the
arg-max changes every fit records (issue #45 items 2 and 3): hand-derived cases through the Scaler interface,
save/load, the stated floor, chunking, a known number of changed voxels."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mcseg.calibration import PosthocConfig, fit_posthoc
from mcseg.calibration import binning_adapters
from mcseg.calibration.scaler_registry import SCALER_TYPES, FitData, FitOptions, build_scaler, load_scaler
from mcseg.data.cases import CaseData
from mcseg.errors import ConfigError
from tests.test_binning_calibrators import FIT, LABELS, TOP_FIT, TOP_LABELS
from tests.conftest import TINY_2D
from tests.test_posthoc_wiring import fake_predictor

FLOOR_LOGIT = math.log(1e-12)


def _fitted(name: str, probs: np.ndarray, labels: np.ndarray, n_bins: int = 2):
    scaler = build_scaler(name, FitOptions(histogram_bins=n_bins))
    logits = torch.log(torch.as_tensor(probs, dtype=torch.float32))  # softmax(ln p) = p
    scaler.fit(FitData((logits, torch.as_tensor(labels)), sample={"voxels": "all"}))
    return scaler


def _calibrated(scaler, probs) -> np.ndarray:
    """softmax of apply, on the voxels laid out as a 2 x 2 (x 1) case: K x *S."""
    p = torch.as_tensor(np.asarray(probs, np.float32)).T  # K x N
    z = torch.log(p).reshape(p.shape[0], 2, -1, 1)
    return torch.softmax(scaler.apply(z), 0).reshape(p.shape[0], -1).T.numpy()


def test_classwise_histogram_binning_through_the_scaler_by_hand():
    hb = _fitted("histogram", FIT, LABELS)
    # (the hand derivation of tests/test_binning_calibrators.py) class 1: bins [0, 0.5] -> 0.5, (0.5, 1] -> 1;
    # class 0: [0, 0.5] -> 0, (0.5, 1] -> 0.5; a voxel (0.8, 0.2) -> (0.5, 0.5), (0.3, 0.7) -> (0, 1)
    out = _calibrated(hb, [[0.8, 0.2], [0.3, 0.7], [0.2, 0.8], [0.9, 0.1]])
    np.testing.assert_allclose(out, [[0.5, 0.5], [0, 1], [0, 1], [0.5, 0.5]], atol=1e-6)
    assert hb.record["calibrator"]["maps"] == [[0.0, 0.5], [0.5, 1.0]]
    assert hb.record["mode"] == "classwise" and hb.label() == "histogram (all, classwise, 2 bins)"
    assert not hb.preserves_argmax and SCALER_TYPES["histogram"] is type(hb)


def test_top_label_scalers_through_the_scaler_by_hand():
    hb = _fitted("histogram_top", TOP_FIT, TOP_LABELS)
    probs = [[0.8, 0.15, 0.05], [0.3, 0.4, 0.3], [0.1, 0.2, 0.7], [0.05, 0.9, 0.05]]
    # class 0's confidences in (0.5, 1] -> 2/3, class 1's (0.5, 1] bin is empty -> its centre 0.75, class 1's
    # [0, 0.5] -> 0, class 2 never predicted (kept); the others share the rest in proportion
    np.testing.assert_allclose(_calibrated(hb, probs), [[2 / 3, 0.25, 1 / 12], [0.5, 0.0, 0.5], [0.1, 0.2, 0.7],
                                                        [0.125, 0.75, 0.125]], atol=1e-6)
    iso = _fitted("isotonic_top", TOP_FIT, TOP_LABELS)
    np.testing.assert_allclose(_calibrated(iso, [[0.65, 0.25, 0.1], [0.1, 0.15, 0.75], [0.3, 0.4, 0.3],
                                                 [0.95, 0.03, 0.02]]),
                               [[0.5, 0.5 * 0.25 / 0.35, 0.5 * 0.1 / 0.35], [0.1, 0.15, 0.75], [0.5, 0, 0.5],
                                [1.0, 0, 0]], atol=1e-6)
    assert iso.label() == "isotonic_top (all, top-label)"


def test_classwise_isotonic_through_the_scaler_by_hand_and_the_floor_of_a_zero():
    iso = _fitted("isotonic", FIT, np.array([1, 0, 1, 1]))
    # (tests/test_binning_calibrators.py) h_0(0.35) = 0.05 / 0.3 * 0.5, h_1(0.65) = 0.5 + 0.25 / 0.3 * 0.5
    h0, h1 = 0.05 / 0.3 * 0.5, 0.5 + 0.25 / 0.3 * 0.5
    out = _calibrated(iso, [[0.35, 0.65], [0.7, 0.3], [0.05, 0.95], [0.05, 0.95]])
    np.testing.assert_allclose(out[:2], [[h0 / (h0 + h1), h1 / (h0 + h1)], [0.5, 0.5]], atol=1e-6)
    # h_0(0.05) = 0: a probability of exactly 0 is the logit ln 1e-12 (finite), and the softmax gives it back
    z = iso.apply(torch.log(torch.tensor([[0.05], [0.95]])).reshape(2, 1, 1))
    assert torch.isfinite(z).all() and float(z[0]) == pytest.approx(FLOOR_LOGIT, abs=1e-5)
    assert float(torch.softmax(z, 0)[0]) == pytest.approx(1e-12, rel=1e-3)


@pytest.mark.parametrize("name", ["histogram", "histogram_top", "isotonic", "isotonic_top"])
def test_saved_records_are_json_and_load_to_the_same_map_and_cases_are_calibrated_in_chunks(name, tmp_path,
                                                                                             monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3000, 4, generator=g) * 3
    target = torch.multinomial(torch.softmax(logits / 2, 1), 1, generator=g)[:, 0]  # over-confident logits
    scaler = build_scaler(name, FitOptions(histogram_bins=10))
    record = scaler.fit(FitData((logits, target), sample={"voxels": "balanced", "n_voxels": 3000}))
    assert record["nll_after"] < record["nll_before"]
    stored = json.loads(json.dumps(scaler.save(tmp_path, "ab" * 32)))
    assert list(tmp_path.iterdir()) == []  # everything is in the record
    loaded = load_scaler(name, stored, tmp_path)
    case = torch.randn(4, 9, 7, 5, generator=g) * 3
    once = scaler.apply(case)
    assert once.shape == case.shape and once.dtype == case.dtype and torch.isfinite(once).all()
    torch.testing.assert_close(loaded.apply(case), once, rtol=0, atol=0)
    monkeypatch.setattr(binning_adapters, "CHUNK", 17)  # 315 voxels in 19 chunks, the last one short
    torch.testing.assert_close(scaler.apply(case), once, rtol=0, atol=0)
    # the calibrated probabilities are the numpy calibrator's
    p = torch.softmax(case.double(), 0).reshape(4, -1).T.numpy()
    np.testing.assert_allclose(torch.softmax(once, 0).reshape(4, -1).T.numpy(), scaler.calibrator.transform(p),
                               atol=1e-6)
    with pytest.raises(ValueError, match="has no 'calibrator'"):
        load_scaler(name, {k: v for k, v in stored.items() if k != "calibrator"}, tmp_path)
    twin = {"histogram": "histogram_top", "histogram_top": "histogram", "isotonic": "isotonic_top",
            "isotonic_top": "isotonic"}[name]
    with pytest.raises(ValueError, match="refit"):
        load_scaler(twin, stored, tmp_path)


def test_multilabel_models_and_the_region_sample_are_refused():
    scaler = build_scaler("isotonic")
    with pytest.raises(ValueError, match="independent \\(sigmoid\\) regions"):
        scaler.fit(FitData((torch.zeros(4, 2), torch.zeros(4, 2)), multilabel=True))
    with pytest.raises(ConfigError, match="'histogram' scaling can change the arg-max"):
        PosthocConfig(fit=["histogram"], apply=["histogram"])  # voxels: region by default
    with pytest.raises(ConfigError, match="posthoc.histogram_bins"):
        PosthocConfig(fit=["histogram"], apply=["histogram"], voxels="all", histogram_bins=0)


def test_fit_records_how_many_fit_voxels_changed_their_argmax(tmp_path):
    # two classes; 5 voxels at p_1 = 0.2 that are all class 1, 7 at p_1 = 0.9 (class 1), 11 at p_1 = 0.1 (class 0).
    # Classwise histogram binning (15 bins): class 1's bin of 0.2 -> 1, of 0.1 -> 0, of 0.9 -> 1; class 0's bin of
    # 0.8 -> 0, of 0.9 -> 1, of 0.1 -> 0: the 5 voxels go from class 0 to (0, 1), the others keep their class.
    # Each group n = 20 times: 460 voxels, enough for the 30 bin values (posthoc.MIN_VOXELS_PER_PARAMETER), so the fit
    # is not warned of as too small (23 voxels were, since issue 55)
    n = 20
    p1 = torch.tensor([0.2] * 5 * n + [0.9] * 7 * n + [0.1] * 11 * n)
    label = torch.tensor([1] * 12 * n + [0] * 11 * n)
    logits = torch.log(torch.stack([1 - p1, p1])).reshape(2, 23 * n, 1)
    case = CaseData("c0", np.zeros((1, 23 * n, 1), np.float32), label.reshape(23 * n, 1).numpy(), (1.0, 1.0),
                    np.eye(4))
    cfg = PosthocConfig(fit=["histogram", "temperature", "vector"], apply=["histogram"], voxels="all")
    record = fit_posthoc(fake_predictor({"c0": logits}), [case], cfg, tmp_path, {"sha256": "0" * 64})
    changes = {name: fit["argmax_changes"] for name, fit in record["scalers"].items()}
    assert changes["histogram"] == {"count": 5 * n, "share": 5 / 23, "of": 23 * n, "voxels": "the fit voxels"}
    assert changes["temperature"]["count"] == 0
    stored = json.loads((tmp_path / "calibration.json").read_text())["fits"]["0" * 64]["scalers"]
    assert stored["histogram"]["argmax_changes"]["count"] == 5 * n
    # vector scaling learns the same flip (a bias towards class 1 on these voxels): counted, not assumed
    z = logits.reshape(2, -1)
    w, b = (torch.tensor(stored["vector"][k])[:, None] for k in ("weight", "bias"))
    assert stored["vector"]["argmax_changes"]["count"] == int(((z * w + b).argmax(0) != z.argmax(0)).sum())
    assert not record["warnings"]


@pytest.mark.slow  # a training (~20 s on one core)
def test_a_run_fits_and_applies_binning_scalers_and_evaluate_reuses_them(make_cfg, tmp_path, one_thread):
    from mcseg.evaluate import evaluate
    from mcseg.train import train

    result = train(make_cfg(TINY_2D + ["posthoc.fit=[histogram,isotonic_top]", "posthoc.apply=[histogram,isotonic_top]",
                                       "posthoc.voxels=balanced", "posthoc.histogram_bins=10"]))
    run = tmp_path / "run"
    (record,) = json.loads((run / "calibration.json").read_text())["fits"].values()
    for name, mode in (("histogram", "classwise"), ("isotonic_top", "top_label")):
        fit = record["scalers"][name]
        assert (fit["voxels"], fit["mode"], fit["calibrator"]["mode"]) == ("balanced", mode, mode)
        assert fit["argmax_changes"]["of"] == record["n_voxels"] > 0 and 0 <= fit["argmax_changes"]["share"] <= 1
        assert fit["nll_after"] <= fit["nll_before"]
    assert record["scalers"]["histogram"]["calibrator"]["n_bins"] == 10
    summary = json.loads((run / "eval" / "test" / "summary.json").read_text())
    assert summary["posthoc"]["histogram"]["label"] == "histogram (balanced, classwise, 10 bins)"
    assert "test_isotonic_top/mean_ece" in result
    after = json.loads((run / "eval" / "test" / "isotonic_top" / "summary.json").read_text())
    assert after["posthoc"]["params"]["calibrator"] == record["scalers"]["isotonic_top"]["calibrator"]
    # evaluate.py applies the fits on record to another split, without fitting again
    stamp = (run / "calibration.json").read_text()
    evaluate(make_cfg([f"ckpt={run / 'checkpoints' / 'best.pt'}", "split=val", "posthoc.apply=[histogram]"],
                      config_name="evaluate", output_dir=tmp_path / "eval_job"))
    assert (run / "calibration.json").read_text() == stamp
    val = json.loads((run / "eval" / "val" / "histogram" / "summary.json").read_text())
    assert val["posthoc"]["params"]["calibrator"] == record["scalers"]["histogram"]["calibrator"]
    assert math.isfinite(val["mean_nll"])


def test_a_binning_scaler_on_a_multilabel_run_is_refused_before_training(make_cfg, tmp_path, one_thread):
    from mcseg.train import train
    from tests.data.data_helpers import TINY_RUN, fake_download

    _, overrides = fake_download("brats_regions", tmp_path)
    with pytest.raises(ConfigError, match=r"posthoc.fit.*'isotonic'.*independent \(sigmoid\) regions"):
        train(make_cfg([*overrides, *TINY_RUN, "posthoc.fit=[temperature,isotonic]", "posthoc.apply=[temperature]",
                        "posthoc.voxels=balanced"]))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_fit_on_too_few_voxels_for_its_parameters_is_warned_of(tmp_path):
    """Issue 55: 23 voxels fit the 30 bin values of classwise histogram binning and the 4 numbers of vector scaling
    without a word; each is now warned of (fewer than posthoc.MIN_VOXELS_PER_PARAMETER voxels per parameter), the
    single temperature (23 voxels, >= 10) is not."""
    p1 = torch.tensor([0.2] * 5 + [0.9] * 7 + [0.1] * 11)
    label = torch.tensor([1] * 12 + [0] * 11)
    logits = torch.log(torch.stack([1 - p1, p1])).reshape(2, 23, 1)
    case = CaseData("c0", np.zeros((1, 23, 1), np.float32), label.reshape(23, 1).numpy(), (1.0, 1.0), np.eye(4))
    cfg = PosthocConfig(fit=["histogram", "temperature", "vector"], apply=["histogram"], voxels="all")
    record = fit_posthoc(fake_predictor({"c0": logits}), [case], cfg, tmp_path, {"sha256": "0" * 64})
    few = [w for w in record["warnings"] if "too few" in w]
    assert len(few) == 2
    assert any("histogram: fitted on 23 voxels for its 30 parameters" in w for w in few)
    assert any("vector: fitted on 23 voxels for its 4 parameters" in w for w in few)
    from mcseg.calibration.posthoc import MIN_VOXELS_PER_PARAMETER

    assert MIN_VOXELS_PER_PARAMETER == 10 and "fewer than 10 per parameter" in few[0]

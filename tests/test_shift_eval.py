"""evaluate.py shift=<suite> end to end (issue #24): one folder per condition, level 0 reused, the shift summary."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mcseg.data.shift import case_seed

from .conftest import TINY_3D, compose_config


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from mcseg.train import train

    root = tmp_path_factory.mktemp("shift")
    for seed in (0, 1):
        train(compose_config("train", TINY_3D + ["trainer.max_epochs=1", "evaluation.bootstrap_samples=10",
                                                 f"seed={seed}"], root / "sweep" / f"s{seed}"))
    return root / "sweep" / "s0"


def _evaluate(out: Path, *overrides):
    from mcseg.evaluate import evaluate

    return evaluate(compose_config("evaluate", ["evaluation.bootstrap_samples=10", "save_predictions=false",
                                                *overrides], out))


def test_a_clean_evaluation_from_before_the_failure_detection_options_is_still_of_the_same_protocol():
    from mcseg.evaluation.shift import _same_origin

    now = {"region": "union_foreground", "failure_region": None, "failure_risk": "macro"}
    older = {"protocol": {"region": "union_foreground"}}  # a summary written before the two keys existed
    assert _same_origin(older, "ab" * 32, now, None) is None
    assert _same_origin(older, "ab" * 32, {**now, "failure_region": "all"}, None) == (
        "another evaluation protocol (evaluation.failure_region: None stored, 'all' requested)")


def test_a_clean_evaluation_from_before_the_rater_options_is_still_of_the_same_protocol():
    """A summary written before a protocol key existed was computed with its default: the rater_* keys (which
    only datasets with several raters use) must not make every earlier clean evaluation 'another protocol'
    (the uncertainty study's ensembles under shift were refused so)."""
    from dataclasses import asdict

    from mcseg.config import EvalProtocol
    from mcseg.evaluation.shift import _same_origin

    now = json.loads(json.dumps(asdict(EvalProtocol())))
    older = {"protocol": {k: v for k, v in now.items() if not k.startswith("rater_")}}
    assert _same_origin(older, "ab" * 32, now, None) is None
    assert _same_origin(older, "ab" * 32, {**now, "rater_crop": "curvas2024"}, None) == (
        "another evaluation protocol (evaluation.rater_crop: 'all' stored, 'curvas2024' requested)")


@pytest.mark.slow
def test_a_shift_suite_writes_one_evaluation_per_condition_and_a_summary(tiny_run, tmp_path):
    clean = tiny_run / "eval" / "test"
    official = (clean / "summary.json").read_bytes()
    result = _evaluate(tmp_path / "job", f"ckpt={tiny_run}", "shift=rood_mri",
                       "shift.corruptions=[ghosting,affine]", "shift.levels=[1]")
    assert (clean / "summary.json").read_bytes() == official  # level 0 is the run's evaluation, not recomputed
    for name in ("ghosting", "affine"):
        cond = clean / "shift" / name / "1"
        assert {"per_case.csv", "summary.json", "provenance.json"} <= {p.name for p in cond.iterdir()}
        prov = json.loads((cond / "provenance.json").read_text())["shift"]
        assert prov["name"] == name and prov["level"] == 1 and prov["suite"] == "rood_mri" and prov["seed"] == 0
        cases = json.loads((clean / "provenance.json").read_text())["split"]["cases"]
        assert prov["case_seeds"] == {c: case_seed(0, c, name, 1) for c in cases}
        assert set(prov["cases"]) == set(cases)  # what was drawn, per case
    assert json.loads((clean / "shift/ghosting/1/provenance.json").read_text())["shift"]["params"] == \
        {"num_ghosts": 3, "intensity": 0.5, "axes": [0, 1]}
    summary = json.loads((clean / "shift_summary.json").read_text())
    assert summary == json.loads(json.dumps(result["shift"]))
    assert summary["levels"] == [0, 1] and summary["corruptions"] == ["ghosting", "affine"]
    raw = summary["predictors"]["raw"]
    assert {"dice", "hd95_mm", "ece", "classwise_ece", "nll"} <= set(raw)
    clean_summary = json.loads(official)
    for metric, key in (("dice", "mean_foreground_dice"), ("ece", "mean_ece"), ("nll", "mean_nll")):
        for name in ("ghosting", "affine"):
            values = raw[metric]["values"][name]
            cond = json.loads((clean / "shift" / name / "1" / "summary.json").read_text())
            assert values == {"0": clean_summary[key], "1": cond[key]}
            per = raw[metric]["per_corruption"][name]
            sign = 1 if metric == "dice" else -1
            assert per["degradation"] == pytest.approx(sign * (values["0"] - values["1"]))
            assert per["overall"] == pytest.approx((values["0"] + 2 / 3 * values["1"]) / (1 + 2 / 3))
        assert raw[metric]["overall"] == pytest.approx(np.mean([raw[metric]["per_corruption"][n]["overall"]
                                                                for n in ("ghosting", "affine")]))
    assert "temperature" in summary["predictors"]  # the run's post-hoc scaler, on record, under shift too
    assert "| ghosting |" in (clean / "shift_summary.md").read_text()

    # again: every condition is reused, and the figures are the same bit for bit
    first = (clean / "shift/affine/1/per_case.csv").read_bytes()
    again = _evaluate(tmp_path / "job2", f"ckpt={tiny_run}", "shift=rood_mri", "shift.corruptions=[affine]",
                      "shift.levels=[1]", f"eval_dir={tmp_path / 'fresh'}")
    assert (tmp_path / "fresh/shift/affine/1/per_case.csv").read_bytes() == first
    assert again["shift"]["predictors"]["raw"]["dice"]["values"]["affine"] == \
        summary["predictors"]["raw"]["dice"]["values"]["affine"]


@pytest.mark.slow
def test_an_ensemble_is_evaluated_under_shift_in_its_own_folder(tiny_run, tmp_path):
    other = tiny_run.parent / "s1"
    result = _evaluate(tmp_path / "job", f"ckpt=[{tiny_run},{other}]", "shift=ct", "shift.corruptions=[noise]",
                       "shift.levels=[2]")
    out = Path(result["provenance"]["output_dir"])
    assert out.parent.parent.name == "ensembles" and out.name == "test"
    cond = json.loads((out / "shift/noise/2/summary.json").read_text())
    assert cond["predictor"]["members"] == 2 and cond["provenance"]["shift"]["params"] == {"std": 26}
    summary = json.loads((out / "shift_summary.json").read_text())
    assert summary["predictors"]["raw"]["ece"]["values"]["noise"]["0"] == result["mean_ece"]
    assert not (tiny_run / "eval/test/shift/noise").exists()  # never into a member's evaluation


@pytest.mark.slow
def test_the_suite_benchmark_times_plain_evaluations_and_the_corrupted_conditions(tiny_run):
    import sys

    from .conftest import ROOT

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_shift

    before = sorted(p for p in tiny_run.rglob("*") if p.is_file())
    record = bench_shift.measure(tiny_run, "rood_mri", 2, ["shift.corruptions=[smoothing,ghosting]", "shift.levels=[2]"])
    assert record["conditions"] == 2 and record["cases"] >= 1 and len(record["plain_seconds"]) == 2
    # the ratio is of the unrounded plain median; the record rounds it to 0.01 s (a tiny run's is about 0.2 s)
    plain = record["plain_median_seconds"]
    assert record["suite_seconds"] / (2 * (plain + 0.005)) - 1e-3 <= record["ratio"] \
        <= record["suite_seconds"] / (2 * max(plain - 0.005, 1e-3)) + 1e-3
    assert sorted(p for p in tiny_run.rglob("*") if p.is_file()) == before  # nothing written into the run

@pytest.mark.slow
def test_the_report_aggregates_shift_over_seeds_and_ensembles_and_draws_severity(tiny_run, tmp_path):
    import csv

    from mcseg.report import cli

    runs = [tiny_run, tiny_run.parent / "s1"]
    quick = "evaluation.figures=false"  # the reliability PNGs cost seconds an evaluation; the numbers are the same
    for i, run in enumerate(runs):  # s0's conditions are the first test's, reused when it ran
        _evaluate(tmp_path / f"job{i}", f"ckpt={run}", "shift=rood_mri", "shift.corruptions=[ghosting,affine]",
                  "shift.levels=[1]", quick)
    ensemble = _evaluate(tmp_path / "job2", f"ckpt=[{runs[0]},{runs[1]}]", "shift=ct", "shift.corruptions=[noise]",
                         "shift.levels=[2]", quick)  # the ensemble test's, reused when it ran
    out = tmp_path / "report"
    assert cli.main([str(tiny_run.parent), "--no-eval", "--out", str(out), "--baseline", "none",
                     "--bootstrap", "10"]) == 0
    lines = list(csv.DictReader(open(out / "shift.csv")))
    got = {(r["suite"], r["predictor"], r["metric"], r["level"]): r for r in lines}
    summaries = [json.loads((run / "eval/test/shift_summary.json").read_text()) for run in runs]
    for predictor, name in (("raw", "single"), ("temperature", "single + T")):
        for metric in ("dice", "ece", "classwise_ece", "nll"):
            blocks = [s["predictors"][predictor][metric] for s in summaries]
            for level in ("0", "1"):  # the mean over corruptions, then mean and std over the two seeds
                per_seed = [np.mean([b["values"][c][level] for c in ("ghosting", "affine")]) for b in blocks]
                line = got[("rood_mri", name, metric, level)]
                assert float(line["mean"]) == pytest.approx(np.mean(per_seed))
                assert float(line["std"]) == pytest.approx(np.std(per_seed, ddof=1)) and line["n"] == "2"
            for score in ("overall", "degradation"):
                assert float(line[f"{score}_mean"]) == pytest.approx(np.mean([b[score] for b in blocks]))
                assert float(line[f"{score}_std"]) == pytest.approx(np.std([b[score] for b in blocks], ddof=1))
    noise = got[("ct", "ensemble of 2", "ece", "2")]
    assert float(noise["mean"]) == pytest.approx(ensemble["shift"]["predictors"]["raw"]["ece"]["values"]["noise"]["2"])
    assert noise["n"] == "1" and ("ct", "ensemble of 2 + T (pooled)", "ece", "2") in got
    assert not any(r["suite"] == "ct" and r["predictor"] == "single" for r in lines)  # no run was under ct
    text = (out / "report.md").read_text().split("## Under shift")[1]
    dice = got[("rood_mri", "single", "dice", "1")]
    assert "### rood_mri: Dice (higher is better)" in text and "### ct: ECE (lower is better)" in text
    assert f"{float(dice['mean']):.3f} ± {float(dice['std']):.3f}" in text
    assert (out / "shift_severity.png").stat().st_size > 0  # the ct suite has no single network: one figure


def test_a_clean_evaluation_of_another_protocol_is_refused_naming_each_key_and_both_values(tiny_run, tmp_path):
    """Issue #34 section 3, shift on a debug=fast run: the refusal said "another evaluation protocol
    (evaluation.*); pass overwrite=true" without naming the keys that differ or their two values."""
    official = (tiny_run / "eval/test/summary.json").read_bytes()
    with pytest.raises(FileExistsError) as refused:
        _evaluate(tmp_path / "job", f"ckpt={tiny_run}", "shift=rood_mri", "shift.corruptions=[ghosting]",
                  "shift.levels=[1]", "evaluation.bootstrap_samples=30", "evaluation.n_bins=10")
    message = str(refused.value)
    assert "evaluation.bootstrap_samples: 10 stored, 30 requested" in message
    assert "evaluation.n_bins: 15 stored, 10 requested" in message and "overwrite=true" in message
    assert "\n" not in message and "figures" not in message  # what only changes which files are written
    assert (tiny_run / "eval/test/summary.json").read_bytes() == official


def test_evaluate_takes_the_evaluation_part_of_a_debug_preset(tiny_run, tmp_path):
    """Issue #34 section 3: evaluate.py --help lists debug=fast, which evaluate refused (+debug=fast too). It now
    applies the preset's evaluation settings (those a debug=fast run was evaluated with), so the README's shift
    example runs on such a run with debug=fast; its training settings do not apply to an evaluation."""
    from mcseg.evaluate import evaluate

    cfg = compose_config("evaluate", ["debug=fast", f"ckpt={tiny_run}", "save_predictions=false",
                                      f"eval_dir={tmp_path / 'fast'}"], tmp_path / "job")
    assert cfg.evaluation.bootstrap_samples == 20 and cfg.evaluation.figures is False
    summary = evaluate(cfg)
    assert summary["protocol"]["bootstrap_samples"] == 20 and not (tmp_path / "fast/reliability.png").exists()
    assert summary["provenance"]["split"]["cases"] == json.loads((tiny_run / "split.json").read_text())["test"]
    with pytest.raises(Exception, match="trainer.max_epochs"):  # a training key named on the command line: refused
        evaluate(compose_config("evaluate", ["debug=fast", f"ckpt={tiny_run}", "trainer.max_epochs=3",
                                             f"eval_dir={tmp_path / 'refused'}"], tmp_path / "job2"))


def test_the_shift_summary_covers_every_condition_on_disk_of_the_checkpoint_and_protocol(tiny_run, tmp_path):
    """Issue #34 section 3, subsets of a suite: evaluating a subset replaced shift_summary.json with that subset;
    the conditions evaluated earlier stayed on disk but dropped out of the summary and the report."""
    out = tmp_path / "eval"
    out.mkdir()
    shutil.copy(tiny_run / "eval/test/summary.json", out)  # the run's clean evaluation, reused as level 0
    _evaluate(tmp_path / "j1", f"ckpt={tiny_run}", "shift=rood_mri", "shift.corruptions=[ghosting]", "shift.levels=[1]",
              f"eval_dir={out}")
    result = _evaluate(tmp_path / "j2", f"ckpt={tiny_run}", "shift=rood_mri", "shift.corruptions=[smoothing]",
                       "shift.levels=[2]", f"eval_dir={out}")
    summary = json.loads((out / "shift_summary.json").read_text())
    assert summary == json.loads(json.dumps(result["shift"]))
    assert summary["corruptions"] == ["smoothing", "ghosting"] and summary["levels"] == [0, 1, 2]
    assert summary["corruption_levels"] == {"smoothing": [0, 2], "ghosting": [0, 1]}
    dice = summary["predictors"]["raw"]["dice"]
    ghosting = json.loads((out / "shift/ghosting/1/summary.json").read_text())["mean_foreground_dice"]
    assert dice["values"]["ghosting"] == {"0": result["mean_foreground_dice"], "1": ghosting}
    assert dice["per_corruption"]["ghosting"]["overall"] is not None and dice["corruptions_scored"] == 2
    assert "| ghosting |" in (out / "shift_summary.md").read_text()

"""Predictors with several members (issue #23): deep ensembles, MC dropout and TTA in the one inference path,
their uncertainty maps and the failure-detection figures of every evaluation.

Three tiny 2D runs are trained once for the module (seeds 0 and 1, and one with dropout); tests that write
evaluate into their own folders.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mcseg.data.cases import CaseData
from mcseg.training.checkpoint import save_checkpoint
from mcseg.inference.build import load_checkpoint
from mcseg.config import InferenceConfig
from mcseg.inference.members import case_seed, flip_views
from mcseg.inference.predict import EnsemblePredictor, SegmentationPredictor
from mcseg.errors import ConfigError
from mcseg.evaluate import evaluate
from mcseg.train import train

from .conftest import TINY_2D, TINY_3D, compose_config

RUN = TINY_2D + ["trainer.deterministic=true", "evaluation.bootstrap_samples=10"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("members")
    for name, extra in {"s0": ["seed=0"], "s1": ["seed=1"], "dropout": ["seed=0", "model.dropout=0.3"]}.items():
        train(compose_config("train", RUN + extra, root / "sweep" / name))
    return SimpleNamespace(root=root, s0=root / "sweep/s0", s1=root / "sweep/s1", dropout=root / "sweep/dropout")


def _evaluate(make_cfg, out: Path, *overrides):
    return evaluate(make_cfg(["evaluation.bootstrap_samples=10", "save_predictions=false", *overrides],
                             config_name="evaluate", output_dir=out))


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------- the members
class Tilt(torch.nn.Module):
    """A 2D 'network' whose logits depend on position (so flips matter) and that has a dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 3, padding=1)
        self.drop = torch.nn.Dropout(0.5)
        self.norm = torch.nn.InstanceNorm2d(3)

    def forward(self, x):
        return self.norm(self.drop(self.conv(x)))


def _predictor(model, **inference) -> SegmentationPredictor:
    return SegmentationPredictor(model, 2, 1, lambda z: torch.softmax(z, 1), False, InferenceConfig(**inference),
                                 [8, 8], "32", torch.device("cpu"))


def _case(seed=0) -> CaseData:
    g = torch.Generator().manual_seed(seed)
    return CaseData("c1", torch.randn(1, 8, 8, generator=g).numpy(), np.zeros((8, 8), np.int64), (1.0, 1.0),
                    np.eye(4))


def test_tta_flips_pool_the_flipped_back_probabilities_of_every_view():
    torch.manual_seed(0)
    model = Tilt().eval()
    case = _case()
    predictor = _predictor(model, tta=["flips"])
    logits, members, _ = predictor.predict(case)
    assert predictor.n_members == 4 and members.members == 4 and flip_views(2, True)[0] == ()
    x = torch.from_numpy(case.image)
    with torch.no_grad():
        views = [torch.softmax(model(x[None].flip([d + 2 for d in axes]))[0].flip([d + 1 for d in axes])
                               if axes else model(x[None])[0], 0) for axes in [(), (0,), (1,), (0, 1)]]
    want = sum(views) / 4
    torch.testing.assert_close(members.mean(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.softmax(logits, 0), want, rtol=1e-5, atol=1e-6)  # logits: ln of the mean


@pytest.mark.parametrize("region, risk", [(None, "macro"), ("all", "micro")])
def test_failure_detection_scores_its_own_region_with_its_own_risk(region, risk):
    from mcseg.evaluation.evaluator import Evaluator
    from mcseg.config import EvalProtocol
    from mcseg.evaluation.cases import evaluate_cases
    from mcseg.metrics.failure import FailureDetection, micro_foreground_dice
    from mcseg.metrics.uncertainty import MAPS

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    case = CaseData("c1", torch.randn(1, 8, 8, generator=g).numpy(),
                    torch.randint(0, 3, (8, 8), generator=g).numpy(), (1.0, 1.0), np.eye(4))
    protocol = EvalProtocol(failure_region=region, failure_risk=risk)
    evaluator = Evaluator(3, ["bg", "a", "b"], protocol)
    failure = FailureDetection(MAPS, region=protocol.failure_region or protocol.region, risk=risk)
    kept = evaluate_cases(_predictor(Tilt().eval()), [case], evaluator, lambda c, p: (p, c.label, c.spacing, c.affine),
                          keep=1, failure=failure)
    pred, label = kept[0][1], torch.from_numpy(case.label)
    scored = int(failure.pooled["predictive_entropy"].errors.sum() + failure.pooled["predictive_entropy"].correct.sum())
    if region == "all":  # the whole image, as Jungo & Reyes; the risk: micro Dice over the foreground voxels
        assert scored == 64 and failure.risks == [pytest.approx(1 - micro_foreground_dice(pred, label))]
    else:  # the calibration region (union of the foregrounds) and 1 - the mean of the classes' Dice
        assert scored == int(((label > 0) | (pred > 0)).sum()) < 64
        assert failure.risks == [pytest.approx(1 - evaluator.summary()["mean_foreground_dice"])]
    assert failure.summary()["protocol"]["voxel_region"] == (region or "union_foreground")


def test_mc_dropout_samples_differ_are_seeded_per_case_and_keep_normalisation_in_eval():
    torch.manual_seed(0)
    model = Tilt().eval()
    seen_modes = []
    model.norm.register_forward_hook(lambda m, i, o: seen_modes.append(m.training))
    predictor = _predictor(model, mc_samples=4)
    members = list(predictor.member_probabilities(_case()))
    assert len(members) == 4 and not torch.allclose(members[0], members[1])  # dropout acts
    assert seen_modes == [False] * 4 and not model.drop.training  # only dropout was in train mode, and back
    torch.manual_seed(123)  # the caller's random state does not matter ...
    again = list(predictor.member_probabilities(_case()))
    assert all(torch.equal(a, b) for a, b in zip(members, again))
    state = torch.get_rng_state()
    list(predictor.member_probabilities(_case()))
    assert torch.equal(state, torch.get_rng_state())  # ... and is not disturbed
    assert case_seed(0, "c1", 1) != case_seed(0, "c2", 1) != case_seed(1, "c2", 1)


def test_member_settings_that_cannot_work_are_one_line():
    plain = torch.nn.Conv2d(1, 3, 3, padding=1)
    with pytest.raises(ValueError, match="inference.mc_samples=4: Conv2d has no dropout module"):
        _predictor(plain, mc_samples=4)
    with pytest.raises(ValueError, match=r"inference.tta=\['mirror'\]: unknown"):
        _predictor(plain, tta=["mirror"])
    with pytest.raises(ValueError, match="tta_noise_std=0.0"):
        _predictor(plain, tta=["noise"], tta_noise_std=0.0)


def test_noise_views_are_reproducible_and_differ_from_the_clean_ones():
    torch.manual_seed(0)
    model = Tilt().eval()
    predictor = _predictor(model, tta=["flips", "noise"])
    a = list(predictor.member_probabilities(_case()))
    b = list(predictor.member_probabilities(_case()))
    assert len(a) == 8 and all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.allclose(a[0], a[4])  # the noisy identity view is not the clean one


def test_an_ensemble_pools_its_members_probabilities():
    torch.manual_seed(0)
    nets = [torch.nn.Conv2d(1, 3, 3, padding=1).eval() for _ in range(3)]
    ensemble = EnsemblePredictor([_predictor(n) for n in nets])
    case = _case()
    logits, members, _ = ensemble.predict(case)
    x = torch.from_numpy(case.image)[None]
    with torch.no_grad():
        want = sum(torch.softmax(n(x)[0], 0) for n in nets) / 3
    torch.testing.assert_close(members.mean(), want)
    maps = members.maps()
    assert float(maps["mutual_information"].min()) >= 0 and float(maps["mutual_information"].max()) > 0


# -------------------------------------------------------------------------------------------- evaluations
@pytest.mark.slow
def test_every_evaluation_reports_failure_detection_and_a_single_network_has_no_epistemic_part(runs, make_cfg,
                                                                                               tmp_path):
    summary = _read(runs.s0 / "eval/test/summary.json")
    fd = summary["failure_detection"]
    assert set(fd) == {"protocol", "predictive_entropy", "expected_entropy", "mutual_information",
                       "one_minus_max_prob"}
    entry = fd["predictive_entropy"]
    assert 0 <= entry["voxel_auroc_pooled"] <= 1 and entry["ueo_threshold"] in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6,
                                                                                 0.7, 0.8, 0.9, 0.95)
    assert entry["image"]["aurc"] >= 0 and entry["image"]["eaurc"] >= -1e-12 and entry["image"]["augrc"] >= 0
    assert fd["mutual_information"]["ueo"] <= fd["predictive_entropy"]["ueo"] + 1e-9  # MI is 0 everywhere
    assert (fd["protocol"]["voxel_region"], fd["protocol"]["risk_definition"]) == ("union_foreground", "macro")
    jungo = _evaluate(make_cfg, tmp_path / "job", f"ckpt={runs.s0}", "evaluation.failure_region=all",
                      "evaluation.failure_risk=micro", f"eval_dir={tmp_path / 'jungo'}")
    assert (jungo["failure_detection"]["protocol"]["voxel_region"], jungo["failure_detection"]["predictive_entropy"][
        "voxel_region"], jungo["failure_detection"]["protocol"]["risk_definition"]) == ("all", "all", "micro")
    assert jungo["protocol"]["region"] == "union_foreground"  # calibration keeps its own region
    assert "predictor" not in summary  # one network: no members


def test_ckpt_list_evaluates_a_deep_ensemble_in_a_folder_of_its_own(runs, make_cfg, tmp_path):
    members_before = {p: p.read_bytes() for r in (runs.s0, runs.s1) for p in (r / "eval/test").rglob("*.json")}
    summary = _evaluate(make_cfg, tmp_path / "job", f"ckpt=[{runs.s0},{runs.s1}]", "evaluation.save_uncertainty=true",
                        "save_predictions=true")
    assert summary["predictor"] == {"members": 2, "pooled": "probabilities"}
    out = Path(summary["provenance"]["output_dir"])
    assert out.parent.parent == runs.root / "sweep" / "ensembles" and out.name == "test"
    assert [m["seed"] for m in summary["provenance"]["members"]] == [0, 1]
    assert (out.parent / "calibration.json").is_file() and "temperature" in summary["posthoc"]  # fitted pooled
    assert {p: p.read_bytes() for p in members_before} == members_before  # no member's eval/ touched
    case = summary["provenance"]["split"]["cases"][0]
    for suffix in ("entropy", "expected_entropy", "mutual_information"):
        assert (out / "predictions" / f"{case}_{suffix}.nii.gz").is_file()
    assert summary["failure_detection"]["mutual_information"]["voxel_auroc_cases"] >= 1
    with pytest.raises(FileExistsError, match="an earlier evaluation of these members"):
        _evaluate(make_cfg, tmp_path / "job2", f"ckpt=[{runs.s1},{runs.s0}]")  # the same set, in another order


def test_ensemble_members_that_disagree_or_repeat_are_refused_naming_them(runs, make_cfg, tmp_path):
    odd = tmp_path / "odd.pt"
    state = load_checkpoint(runs.s1 / "checkpoints/best.pt")
    state["split"] = {**state["split"], "test": state["split"]["test"][:-1]}
    save_checkpoint(odd, state)
    with pytest.raises(ValueError, match=f"{odd}: cannot join an ensemble .*split"):
        _evaluate(make_cfg, tmp_path / "job", f"ckpt=[{runs.s0},{odd}]", f"eval_dir={tmp_path / 'x'}")
    with pytest.raises(ConfigError, match="listed twice"):
        _evaluate(make_cfg, tmp_path / "job", f"ckpt=[{runs.s0},{runs.s0}/checkpoints/best.pt]")
    with pytest.raises(ConfigError, match="runs of 2 configurations"):  # the dropout run is another configuration
        _evaluate(make_cfg, tmp_path / "job", f"ckpt=[{runs.root / 'sweep'}]")


def test_an_ensemble_of_copies_is_refused_and_a_member_still_training_is_warned_of(runs, make_cfg, tmp_path,
                                                                                    caplog):
    """Issue #34 section 3, identical members: two runs of one configuration and seed (bitwise equal weights) were
    evaluated as an "ensemble of 2" with the single network's figures, without a word; a member whose run is
    still training was pooled silently with the checkpoint it held at that moment."""
    import logging
    import shutil

    twin = tmp_path / "twin" / "checkpoints" / "best.pt"
    twin.parent.mkdir(parents=True)
    state = load_checkpoint(runs.s0 / "checkpoints/best.pt")
    state["epoch"] = state["epoch"] + 1  # another file (another sha256), the same weights
    save_checkpoint(twin, state)
    with pytest.raises(ConfigError, match=f"{runs.s0}/checkpoints/best.pt and {twin} hold identical weights"):
        _evaluate(make_cfg, tmp_path / "job", f"ckpt=[{runs.s0},{twin}]", f"eval_dir={tmp_path / 'copies'}")
    assert not (tmp_path / "copies").exists()

    training = tmp_path / "training"
    shutil.copytree(runs.s1, training, ignore=shutil.ignore_patterns("eval", "tensorboard"))
    (training / "result.json").unlink()
    (training / "status.json").write_text(json.dumps({"status": "running"}))
    with caplog.at_level(logging.WARNING):
        summary = _evaluate(make_cfg, tmp_path / "job2", f"ckpt=[{runs.s0},{training}]", "posthoc.apply=[]",
                            f"eval_dir={tmp_path / 'still'}")
    epoch = load_checkpoint(training / "checkpoints/best.pt")["epoch"]
    assert f"{training}/checkpoints/best.pt: its run has not finished training" in caplog.text
    assert f"epoch {epoch}" in caplog.text
    assert [m["finished"] for m in summary["provenance"]["members"]] == [True, False]


def test_evaluate_mc_dropout_and_tta_of_a_checkpoint_beside_its_own_evaluation(runs, make_cfg, tmp_path):
    with pytest.raises(ValueError, match="has no dropout module"):
        _evaluate(make_cfg, tmp_path / "j0", f"ckpt={runs.s0}", "mc_samples=3")
    official = (runs.dropout / "eval/test/summary.json").read_bytes()
    mc = _evaluate(make_cfg, tmp_path / "j1", f"ckpt={runs.dropout}", "mc_samples=3", "tta=[flips]")
    out = Path(mc["provenance"]["output_dir"])
    assert out == runs.dropout / "eval" / "test-tta-flips-mc3"
    assert mc["predictor"]["members"] == 12 and mc["provenance"]["inference"]["mc_samples"] == 3
    assert (out / "calibration.json").is_file()  # the pooled prediction's own fit, not the run's
    assert (runs.dropout / "eval/test/summary.json").read_bytes() == official
    again = _evaluate(make_cfg, tmp_path / "j2", f"ckpt={runs.dropout}", "mc_samples=3", "tta=[flips]",
                      f"eval_dir={tmp_path / 'again'}")
    assert again["mean_foreground_dice"] == mc["mean_foreground_dice"] and again["mean_ece"] == mc["mean_ece"]


@pytest.mark.parametrize("value", ["2.5", "1", "-2"])
def test_mc_samples_that_are_not_a_whole_number_of_passes_are_one_line_naming_the_key(runs, make_cfg, tmp_path, value):
    """Issue #34 section 3, mc_samples: 2.5 was accepted, recorded as 2.5 and reported as "mc2.5" while 2 samples
    were drawn; an integer >= 2 (or 0, off) is expected, anything else is one line naming the key."""
    with pytest.raises(ConfigError, match=rf"config key 'mc_samples'={value}: expected an integer >= 2"):
        _evaluate(make_cfg, tmp_path / "job", f"ckpt={runs.dropout}", f"mc_samples={value}")
    assert not list((runs.dropout / "eval").glob("test-mc*"))  # refused before anything was written


def test_tta_in_3d_pools_eight_views(make_cfg, tmp_path):
    summary = train(make_cfg(TINY_3D + ["trainer.max_epochs=1", "inference.tta=[flips]", "posthoc.fit=[]",
                                        "posthoc.apply=[]", "evaluation.bootstrap_samples=10"]))
    result = _read(tmp_path / "run/eval/test/summary.json")
    assert result["predictor"]["members"] == 8 and result["provenance"]["inference"]["tta"] == ["flips"]
    assert summary["test/mean_foreground_dice"] is not None


def test_tensorboard_shows_the_uncertainty_beside_the_prediction_and_the_run_in_its_hparams_view(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(runs.s0 / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    tag = next(t for t in events.Tags()["images"] if t.startswith("val/"))
    image = events.Images(tag)[-1]
    assert image.width == 4 * image.height  # image, label, prediction, uncertainty (square 32 x 32 slices)
    hparams = list((runs.s0 / "tensorboard" / "hparams").glob("events.out.tfevents.*"))
    assert hparams, "no HParams record"
    plugin = EventAccumulator(str(runs.s0 / "tensorboard" / "hparams"))
    plugin.Reload()
    assert "final/test_mean_foreground_dice" in plugin.Tags()["scalars"]


@pytest.mark.slow  # 26 s of evaluations and a report; the default run is at its 15-minute budget
def test_the_report_compares_predictors_and_draws_risk_coverage(runs, make_cfg, tmp_path):
    from mcseg.report import cli
    from mcseg.report.table import DEGENERATE_MARK

    _evaluate(make_cfg, tmp_path / "job", f"ckpt=[{runs.s0},{runs.s1}]", "overwrite=true")
    _evaluate(make_cfg, tmp_path / "job2", f"ckpt={runs.s0}", "tta=[flips]", "overwrite=true")
    _evaluate(make_cfg, tmp_path / "job3", f"ckpt=[{runs.s0},{runs.s1}]", "posthoc.pool=after", "overwrite=true")
    out = tmp_path / "report"
    assert cli.main([str(runs.root / "sweep"), "--no-eval", "--out", str(out), "--baseline", "none"]) == 0
    text = (out / "report.md").read_text()
    table = text.split("## Predictors of the configurations")[1]
    # the tiny runs' temperatures may be degenerate fits, which the report marks (issue #43): compare the names
    rows = {line.split(" | ")[2].removesuffix(DEGENERATE_MARK): line for line in table.splitlines()
            if line.startswith("| ce |")}
    assert {"single", "single + T", "ensemble of 2", "ensemble of 2 + T (pooled)", "tta-flips",
            "tta-flips + T (pooled)", "ensemble of 2 + T (each network's, then pooled)"} <= set(rows)
    assert not any("pool-after" in name for name in rows)  # its raw pooled prediction is the plain ensemble's
    ensemble = _read(next((runs.root / "sweep/ensembles").glob("ensemble2-*/test/summary.json")))
    assert f"{ensemble['mean_foreground_dice']:.3f}" in rows["ensemble of 2"]
    assert (out / "risk_coverage_selected.png").is_file()
    assert "case risk macro (1 - macro foreground Dice" in text and "voxels of region `union_foreground`" in text
    assert "## Under shift" not in text  # nothing evaluated under shift: no section, table or figure
    assert not (out / "shift.csv").exists() and not list(out.glob("shift_severity*.png"))


@pytest.mark.slow
def test_pooled_after_each_network_is_scaled_by_its_own_fit_before_pooling(runs, make_cfg, tmp_path):
    torch.manual_seed(0)
    nets = [torch.nn.Conv2d(1, 3, 3, padding=1).eval() for _ in range(2)]
    ensemble = EnsemblePredictor([_predictor(n, tta=["flips"]) for n in nets])
    case = _case()
    temperatures = [0.5, 3.0]
    after = {"temperature": [lambda z, c, t=t: z / t for t in temperatures]}
    _, _, pooled_after = ensemble.predict(case, after)
    x = torch.from_numpy(case.image)[None]
    views = [(), (0,), (1,), (0, 1)]
    with torch.no_grad():
        want = sum(torch.softmax(n(x.flip([a + 2 for a in v]))[0].flip([a + 1 for a in v]) / t, 0)
                   for n, t in zip(nets, temperatures) for v in views) / 8
    torch.testing.assert_close(torch.softmax(pooled_after["temperature"], 0), want, rtol=1e-5, atol=1e-6)

    summary = _evaluate(make_cfg, tmp_path / "job", f"ckpt=[{runs.s0},{runs.s1}]", "posthoc.pool=after",
                        f"eval_dir={tmp_path / 'after'}")
    after_t = summary["posthoc"]["temperature"]
    recorded = [json.loads((r / "calibration.json").read_text()) for r in (runs.s0, runs.s1)]
    own = [next(iter(c["fits"].values()))["scalers"]["temperature"]["temperature"] for c in recorded]
    assert [p["temperature"] for p in after_t["params"]] == own and "pooled after" in after_t["label"]
    assert not (tmp_path / "calibration.json").exists() and not (tmp_path / "after/calibration.json").exists()


@pytest.mark.slow  # about 40 and 60 s: the default run is near its 15-minute budget
def test_other_pooling_or_members_of_the_same_networks_get_folders_of_their_own(runs, make_cfg, tmp_path):
    """The same member set pooled after scaling, or with TTA, is another predictor: it must not be refused as
    'an earlier evaluation of these members' nor land in the plain ensemble's folder (nor a TTA evaluation
    pooled after in the TTA folder pooled before)."""
    members = f"ckpt=[{runs.s0},{runs.s1}]"
    plain = _evaluate(make_cfg, tmp_path / "j0", members, "overwrite=true")
    after = _evaluate(make_cfg, tmp_path / "j1", members, "posthoc.pool=after", "overwrite=true")
    tta = _evaluate(make_cfg, tmp_path / "j2", members, "tta=[flips]", "overwrite=true")
    folders = [Path(s["provenance"]["output_dir"]) for s in (plain, after, tta)]
    assert [f.name for f in folders] == ["test", "test-pool-after", "test-tta-flips"]
    assert len({f.parent for f in folders}) == 1  # the same member set
    assert tta["predictor"]["members"] == 8
    single_before = _evaluate(make_cfg, tmp_path / "j3", f"ckpt={runs.s1}", "tta=[flips]", "overwrite=true")
    single_after = _evaluate(make_cfg, tmp_path / "j4", f"ckpt={runs.s1}", "tta=[flips]", "posthoc.pool=after",
                             "overwrite=true")
    assert Path(single_before["provenance"]["output_dir"]).name == "test-tta-flips"
    assert Path(single_after["provenance"]["output_dir"]).name == "test-tta-flips-pool-after"
    assert "pooled after" in single_after["posthoc"]["temperature"]["label"]
    assert "pooled after" not in single_before["posthoc"]["temperature"]["label"]


@pytest.mark.slow  # about 40 and 60 s: the default run is near its 15-minute budget
def test_the_uncertainty_study_script_tabulates_every_predictor_and_resumes(runs, tmp_path, monkeypatch):
    import csv
    import sys

    from .conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import uncertainty_study

    out = tmp_path / "study"
    argv = ["uncertainty_study.py", str(runs.root / "sweep"), "--dropout", str(runs.dropout), "--mc-samples", "2",
            "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert uncertainty_study.main() == 0
    rows = list(csv.DictReader(open(out / "per_evaluation.csv")))
    predictors = {r["predictor"] for r in rows}
    assert {"single", "single + T", "ensemble of 2", "ensemble of 2 + T (pooled)",
            "ensemble of 2 + T (each network's, then pooled)", "TTA (flips)", "TTA (flips) + T (pooled)",
            "dropout net, one pass", "MC dropout (2)", "MC dropout (2) + T (pooled)"} <= predictors
    plain = _read(next((runs.root / "sweep/ensembles").glob("ensemble2-*/test/summary.json")))
    row = next(r for r in rows if r["predictor"] == "ensemble of 2")
    assert float(row["Dice"]) == pytest.approx(plain["mean_foreground_dice"]) and row["AUROC MI"] != ""
    mc = next(r for r in rows if r["predictor"] == "MC dropout (2)")
    assert float(mc["ECE"]) == pytest.approx(_read(runs.dropout / "eval/test-mc2/summary.json")["mean_ece"])
    assert "| ensemble of 2 + T (each network's, then pooled) |" in (out / "table.md").read_text()
    monkeypatch.setattr(sys, "argv", argv + ["--seeds", "3", "--out", str(tmp_path / "none")])
    assert uncertainty_study.main() == 0  # no configuration has three finished runs: only the dropout run's rows
    assert {r["predictor"] for r in csv.DictReader(open(tmp_path / "none/per_evaluation.csv"))} == {
        "dropout net, one pass", "MC dropout (2)", "MC dropout (2) + T (pooled)"}
    monkeypatch.setattr(sys, "argv", argv)
    assert uncertainty_study.main() == 0  # everything read back: no evaluation is run again
    again = list(csv.DictReader(open(out / "per_evaluation.csv")))
    assert [r["Dice"] for r in again] == [r["Dice"] for r in rows] and all(float(r["seconds"]) == 0 for r in again)


@pytest.mark.slow
def test_a_shift_suite_runs_with_tta_and_mc_dropout_on_2d_runs_and_the_report_shows_them(runs, make_cfg, tmp_path):
    from mcseg.report import cli

    suite = ["shift=rood_mri", "shift.corruptions=[ghosting]", "shift.levels=[1]", "overwrite=true",
             "evaluation.figures=false"]  # the reliability PNGs cost seconds an evaluation
    tta = _evaluate(make_cfg, tmp_path / "j1", f"ckpt={runs.s0}", "tta=[flips]", *suite)
    mc = _evaluate(make_cfg, tmp_path / "j2", f"ckpt={runs.dropout}", "mc_samples=2", *suite)
    for result, folder, members in ((tta, runs.s0 / "eval/test-tta-flips", 4), (mc, runs.dropout / "eval/test-mc2", 2)):
        cond = _read(folder / "shift/ghosting/1/summary.json")
        assert cond["predictor"]["members"] == members and cond["provenance"]["shift"]["name"] == "ghosting"
        assert cond["provenance"]["inference"] == result["provenance"]["inference"]  # the same members as level 0
        ece = result["shift"]["predictors"]["raw"]["ece"]["values"]["ghosting"]
        assert ece == {"0": result["mean_ece"], "1": cond["mean_ece"]} and ece["0"] != ece["1"]
        assert "temperature" in result["shift"]["predictors"]  # the pooled prediction's own fit, under shift too
    out = tmp_path / "report"
    assert cli.main([str(runs.root / "sweep"), "--no-eval", "--out", str(out), "--baseline", "none",
                     "--bootstrap", "10"]) == 0
    table = (out / "report.md").read_text().split("### rood_mri: ECE")[1].split("###")[0]
    rows = {line.split(" | ")[2]: line for line in table.splitlines() if line.startswith("| ce |")}
    assert {"tta-flips", "tta-flips + T (pooled)", "mc2", "mc2 + T (pooled)"} <= set(rows)
    assert f"| {mc['mean_ece']:.3f} |" in rows["mc2"]  # one evaluation: its value, no std
    assert not list(out.glob("shift_severity*.png"))  # no single network under shift: nothing to draw

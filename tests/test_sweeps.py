"""Sweeps through Hydra (study sweeper, joblib, submitit), failed jobs, sweep evaluation, mcseg-report.

The Optuna sweeper: tests/test_optuna_sweeper.py."""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mcseg.report.cli import main as report_main
from tests.conftest import ROOT, TINY_2D, run_cli
from tests.test_rundir import snapshot

# Fast jobs: temperature scaling only, few bootstrap resamples.
SWEEP_JOB = TINY_2D + ["posthoc.fit=[temperature]", "posthoc.apply=[temperature]", "logger.images=0",
                       "evaluation.bootstrap_samples=20"]


def _job_dirs(sweep: Path) -> list[Path]:
    return sorted(p.parent for p in sweep.glob("*/status.json"))


@pytest.fixture(scope="module")
def margin_sweep(tmp_path_factory) -> Path:
    """Two margins x two seeds through the study sweeper, plus an arm whose jobs fail (negative margin)."""
    sweep = tmp_path_factory.mktemp("sweep") / "multirun"
    arms = '{bad:"loss=margin loss.margin=-1",margin:"loss=margin loss.margin=2,5"}'
    proc = run_cli("train.py", ["-m", "hydra/sweeper=study", f"hydra.sweeper.arms={arms}", "seed=0,1",
                                f"hydra.sweep.dir={sweep}", *SWEEP_JOB], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


@pytest.mark.slow
def test_a_failed_job_does_not_end_the_sweep_and_is_summarised(margin_sweep):
    jobs = _job_dirs(margin_sweep)
    assert len(jobs) == 6
    statuses = [json.loads((j / "status.json").read_text()) for j in jobs]
    failed = [s for s in statuses if s["status"] == "failed"]
    assert sorted(tuple(s["overrides"][:3]) for s in failed) == [("loss=margin", "loss.margin=-1", "seed=0"),
                                                                  ("loss=margin", "loss.margin=-1", "seed=1")]
    assert all("margin" in s["error"] for s in failed)
    assert all(s["status"] == "completed" for s in statuses if s not in failed)
    summary = json.loads((margin_sweep / "sweep_summary.json").read_text())
    assert summary["counts"] == {"completed": 4, "failed": 2}
    assert "loss.margin=-1" in (margin_sweep / "sweep_summary.md").read_text()
    # readable job directory names: job number, then the swept values
    assert any(j.name.startswith("2_loss=margin,margin=2,seed=0,") for j in jobs)
    assert all(len(j.name) <= 130 for j in jobs)


def test_report_rows_match_the_runs_own_summaries(margin_sweep, tmp_path):
    out = tmp_path / "report"
    assert report_main([str(margin_sweep), "--out", str(out), "--no-eval", "--bootstrap", "50",
                        "--baseline", "none"]) == 0
    with open(out / "report.csv", newline="") as f:
        rows = {r["hyperparameters"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"loss.margin=2", "loss.margin=5"}
    for margin in (2, 5):
        runs = [j for j in _job_dirs(margin_sweep) if f"margin={margin}," in j.name]
        runs = [j for j in runs if (j / "eval" / "test" / "summary.json").is_file()]
        assert len(runs) == 2
        summaries = [json.loads((j / "eval" / "test" / "summary.json").read_text()) for j in runs]
        posts = [json.loads((j / "eval" / "test" / "temperature" / "summary.json").read_text()) for j in runs]
        results = [json.loads((j / "result.json").read_text()) for j in runs]
        row = rows[f"loss.margin={margin}"]
        assert row["seeds"] == "0 1"
        for column, key, source in (("dice", "mean_foreground_dice", summaries), ("ece", "mean_ece", summaries),
                                    ("hd95_mm", "mean_foreground_hd95_mm", summaries),
                                    ("ece_post_T", "mean_ece", posts)):
            values = [s[key] for s in source]
            mean = sum(values) / 2
            std = math.sqrt(sum((v - mean) ** 2 for v in values))  # ddof=1 with two values
            assert float(row[f"{column}_mean"]) == pytest.approx(mean, rel=1e-9)
            assert float(row[f"{column}_std"]) == pytest.approx(std, rel=1e-6, abs=1e-12)
            assert float(row[f"{column}_ci95_lo"]) <= float(row[f"{column}_ci95_hi"])
        assert float(row["selection_value"]) == pytest.approx(sum(r["score"] for r in results) / 2)
    # the margin with the higher mean validation score is the selected one
    best = max(rows.values(), key=lambda r: float(r["selection_value"]))
    assert best["selected"] == "True" and sum(r["selected"] == "True" for r in rows.values()) == 1
    text = (out / "report.md").read_text()
    left_out = text.split("## Runs left out")[1]
    assert left_out.count("| failed |") == 2 and "margin" in left_out
    assert (out / "report.tex").read_text().count(r"\\") >= 2
    assert (out / "reliability_selected.png").stat().st_size > 1000
    assert (out / "margin_heatmap.png").stat().st_size > 1000


@pytest.mark.slow
def test_evaluate_a_whole_sweep_on_another_split(margin_sweep, tmp_path):
    proc = run_cli("evaluate.py", [f"runs={margin_sweep}", "split=val", "posthoc.apply=[temperature]",
                                   "evaluation.bootstrap_samples=10", "save_predictions=false",
                                   f"hydra.run.dir={tmp_path / 'job'}"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads((tmp_path / "job" / "evaluated_runs.json").read_text())
    assert len(done) == 4 and all(v["status"] == "completed" for v in done.values())
    for run in done:
        assert (Path(run) / "eval" / "val" / "temperature" / "summary.json").is_file()
    assert "evaluated 4 of 4 runs" in proc.stdout


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_in_parallel_processes(tmp_path):
    sweep = tmp_path / "parallel"
    # with a loader worker: DataLoader workers must start inside joblib's (loky) worker processes
    proc = run_cli("train.py", ["-m", "hydra/launcher=parallel", "seed=0,1", f"hydra.sweep.dir={sweep}",
                                "posthoc.fit=[]", "posthoc.apply=[]", *SWEEP_JOB[:-3],
                                "dataset.sampling.num_workers=1"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = [json.loads(p.read_text()) for p in sweep.glob("*/status.json")]
    assert len(statuses) == 2 and {s["status"] for s in statuses} == {"completed"}
    assert len({s["pid"] for s in statuses}) == 2  # one worker process per job


@pytest.mark.slow
def test_slurm_preset_composes_and_submitit_runs_locally(make_cfg, tmp_path):
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition == "gpu" and launcher.gpus_per_node == 1 and launcher.max_num_timeout == 3

    sweep = tmp_path / "submitit"
    proc = run_cli("train.py", ["-m", "hydra/launcher=submitit_debug", "seed=0", f"hydra.sweep.dir={sweep}",
                                "posthoc.fit=[]", "posthoc.apply=[]", *SWEEP_JOB[:-3]], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = [json.loads(p.read_text()) for p in sweep.glob("*/status.json")]
    assert [s["status"] for s in statuses] == ["completed"]
    assert (sweep / ".submitit").is_dir()


@pytest.mark.slow
def test_report_evaluates_runs_missing_an_evaluation(margin_sweep, tmp_path):
    import shutil

    run = next(j for j in _job_dirs(margin_sweep) if (j / "result.json").is_file())
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "eval")
    (copy / "calibration.json").unlink()
    assert report_main([str(tmp_path / "runs"), "--no-eval", "--out", str(tmp_path / "listed")]) == 0
    assert "not evaluated" in (tmp_path / "listed" / "report.md").read_text()
    assert report_main([str(tmp_path / "runs"), "--device", "cpu", "--bootstrap", "20",
                        "--out", str(tmp_path / "report")]) == 0
    original = json.loads((run / "eval" / "test" / "summary.json").read_text())
    redone = json.loads((copy / "eval" / "test" / "summary.json").read_text())
    assert redone["mean_foreground_dice"] == pytest.approx(original["mean_foreground_dice"], rel=1e-6)
    assert (copy / "eval" / "test" / "temperature" / "summary.json").is_file()
    assert "not evaluated" not in (tmp_path / "report" / "report.md").read_text()


# ---------------------------------------------------------------- continuing an interrupted sweep (issue #22, 3)

def test_job_directory_names_leave_out_resume_overrides():
    """A sweep run again with trainer.auto_resume=true (or trainer.resume) must find its jobs' directories."""
    from mcseg.identity import job_name

    job = ["loss=margin", "loss.margin=2", "seed=0", "optim.lr=0.01"]
    assert job_name(job + ["trainer.auto_resume=true"]) == job_name(job) == "loss=margin,margin=2,seed=0,optim.lr=0.01"
    assert job_name(["trainer.resume=true", *job]) == job_name(job)
    assert job_name(["++trainer.auto_resume=true", *job]) == job_name(job)
    assert job_name([*job, "logger=[tensorboard,mlflow]", "logger.images=0"]) == job_name(job)  # trackers too


def test_a_finished_job_is_skipped_when_its_sweep_runs_again(margin_sweep, make_cfg, monkeypatch, caplog):
    from mcseg import sweep
    from mcseg.train import train

    job = next(j for j in _job_dirs(margin_sweep) if (j / "result.json").is_file())
    overrides = json.loads((job / "status.json").read_text())["overrides"] + ["trainer.auto_resume=true"]
    before = snapshot(job)
    monkeypatch.setattr(sweep, "hydra_job", lambda: (True, overrides, 2))  # job 2 of a multirun
    with caplog.at_level("INFO", logger="mcseg"):
        result = sweep.run_job(train, make_cfg(overrides, output_dir=job), checks_itself=True)
    assert result["score"] == json.loads((job / "result.json").read_text())["score"]  # what Optuna would read
    assert f"job 2 ({job.name}) already completed: skipped" in caplog.text
    assert snapshot(job) == before  # not trained, evaluated or recorded again


@pytest.mark.slow
def test_a_sweep_ended_by_an_exception_still_writes_its_summary(tmp_path):
    sweep = tmp_path / "multirun"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MCSEG_TRACEBACK": "1"}  # a failed job's exception ends the sweep
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "loss=margin", "loss.margin=-1",
                           f"hydra.sweep.dir={sweep}", *SWEEP_JOB], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "margin" in done.stderr
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["counts"] == {"failed": 1}
    assert "ended early" in (sweep / "sweep_summary.md").read_text()


@pytest.mark.slow
def test_an_interrupted_sweep_continues_when_run_again(tmp_path):
    """SIGTERM in the second of two jobs; the same sweep run again with trainer.auto_resume=true skips the
    finished job, resumes the interrupted one from its last.pt in the same directory, and summarises both runs."""
    sweep = tmp_path / "multirun"
    args = ["-m", "seed=0,1", f"hydra.sweep.dir={sweep}", "posthoc.fit=[]", "posthoc.apply=[]", *SWEEP_JOB[:-3]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MCSEG_TERM_AT_STEP": "7"}  # 4 steps a job: job 1's 3rd step
    env.pop("MCSEG_TRACEBACK", None)
    first = subprocess.run([sys.executable, str(ROOT / "tests/interrupt_wrapper.py"), *args], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 143, first.stderr[-3000:]
    finished, stopped = _job_dirs(sweep)
    assert json.loads((sweep / "sweep_summary.json").read_text())["counts"] == {"completed": 1, "interrupted": 1}
    assert "trainer.auto_resume=true" in (sweep / "sweep_summary.md").read_text()  # how to continue
    assert (stopped / "checkpoints" / "last.pt").is_file() and not (stopped / "result.json").exists()
    untouched = snapshot(finished)

    again = run_cli("train.py", args + ["trainer.auto_resume=true"], timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _job_dirs(sweep) == [finished, stopped]  # the same directories, no new ones
    assert f"({finished.name}) already completed: skipped" in again.stdout + again.stderr
    assert snapshot(finished) == untouched
    resumes = yaml.safe_load((stopped / ".hydra" / "resumes.yaml").read_text())
    assert len(resumes) == 1 and "trainer.auto_resume=true" in [o.lower() for o in resumes[0]["overrides"]]
    assert "resumed " in (stopped / "train.log").read_text()
    assert json.loads((stopped / "status.json").read_text())["status"] == "completed"
    assert json.loads((sweep / "sweep_summary.json").read_text())["counts"] == {"completed": 2}

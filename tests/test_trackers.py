"""Trackers (issue #38): what a training, its resume, a re-evaluation and a sweep log, read back through each
library's own API (MLflow: MlflowClient on the SQLite store; wandb: the offline run's transaction log, read
with wandb's own reader, `wandb leet inspect --json`; CSV: the csv module; TensorBoard: its EventAccumulator).

One tiny training with every tracker on, interrupted in its last epoch and resumed, then re-evaluated on its
validation split, is shared by the module (one MLflow database, created once: its migrations are the slow part)."""
from __future__ import annotations

import csv
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcseg.trackers.base import Tracker
from tests.conftest import ROOT, TINY_2D, compose_config, require, run_cli


@pytest.fixture(scope="module")
def mlflow_installed():
    require("mlflow", "the tracker tests log into MLflow's own store (the test extra)")


@pytest.fixture(scope="module")
def both_installed(mlflow_installed):
    require("wandb", "the tracker tests log into wandb's offline run (the test extra)")


needs_both = pytest.mark.usefixtures("both_installed")
ALL = "logger=[tensorboard,csv,mlflow,wandb]"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture(scope="module")
def logged(tmp_path_factory, store, both_installed):
    """A tiny run with every tracker on: killed in its second (last) epoch's validation, resumed, then
    re-evaluated on its validation split. Returns the run folder."""
    from mcseg.evaluate import evaluate
    from mcseg.train import train
    from mcseg.training.trainer import Trainer

    base = tmp_path_factory.mktemp("tracked")
    run = base / "run"
    overrides = TINY_2D + [ALL, f"logger.mlflow.tracking_uri={store}", "trainer.deterministic=true"]
    validate = Trainer.validate

    def killed_in_the_second_validation(self, epoch, full=False):
        if epoch == 1:  # epoch 2's steps were logged, its checkpoint not yet written
            raise KeyboardInterrupt("simulated interruption")
        return validate(self, epoch, full)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCSEG_CACHE_DIR", str(base / "cache"))
        mp.setenv("WANDB_SILENT", "true")
        mp.setattr(Trainer, "validate", killed_in_the_second_validation)
        with pytest.raises(KeyboardInterrupt):
            train(compose_config("train", overrides, run))
        mp.setattr(Trainer, "validate", validate)
        train(compose_config("train", overrides + ["trainer.resume=true"], run))
        evaluate(compose_config("evaluate", [f"ckpt={run}", "split=val"], base / "evaluate"))
    return run


@needs_both
def test_mlflow_holds_one_run_with_params_metrics_per_step_and_artefacts(logged, store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    record = json.loads((logged / "trackers.json").read_text())
    assert record["mlflow"]["tracking_uri"] == store and record["step"] == 4
    experiment = client.get_experiment_by_name("synthetic2d")  # the dataset's name
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`mcseg.run_dir` = '{logged}'")
    assert [r.info.run_id for r in runs] == [record["mlflow"]["run_id"]]  # the resume did not start another run
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params, tags = run.data.params, run.data.tags
    assert params["loss._target_"] == "mcseg.losses.CELoss" and params["optim.lr"] == "0.001"
    assert params["model.channels"] == "[8, 16, 32]" and params["trainer.max_epochs"] == "2"
    result = json.loads((logged / "result.json").read_text())["run"]
    assert tags["configuration"] == result["configuration"]
    assert tags["configuration_sha256"] == result["configuration_sha256"]
    assert tags["dataset_content_sha256"] == result["dataset_content"]
    assert tags["code.git_commit"] and tags["libraries.torch"]

    def steps(key):
        return [m.step for m in client.get_metric_history(run.info.run_id, key)]

    # each step once, continuing where the checkpoint was: the interrupted epoch's values were never sent
    assert steps("train/loss_step") == [1, 2, 3, 4]
    assert steps("val/mean_ece") == [2, 4] and steps("train/loss") == [2, 4]
    summary = json.loads((logged / "eval/test/summary.json").read_text())
    metrics = run.data.metrics
    for key in ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece", "mean_nll",
                "mean_brier"):
        assert metrics[f"eval/test/{key}"] == pytest.approx(summary[key]), key
    assert "eval/test/failure_detection/predictive_entropy/image/aurc" in metrics
    # the re-evaluation went to the same run, at its last step
    val = json.loads((logged / "eval/val/summary.json").read_text())
    assert metrics["eval/val/mean_ece"] == pytest.approx(val["mean_ece"]) and steps("eval/val/mean_ece") == [4]
    assert {f.path for f in client.list_artifacts(run.info.run_id, "eval/test")} >= {
        "eval/test/summary.json", "eval/test/provenance.json"}
    assert "eval/val/summary.json" in {f.path for f in client.list_artifacts(run.info.run_id, "eval/val")}


def _wandb_records(run: Path) -> list[dict]:
    """Every record of the run's offline transaction logs, oldest folder first, read with wandb's own reader
    (``wandb leet inspect --json``: one JSON object per record, keys as logged)."""
    records = []
    for path in sorted(run.glob("wandb/offline-run-*/run-*.wandb")):
        read = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                              capture_output=True, text=True, timeout=120)
        assert read.returncode == 0, read.stderr[-2000:]
        records += [json.loads(line) for line in read.stdout.splitlines() if line.strip()]
    return records


@needs_both
def test_wandb_offline_run_continues_one_run_id_read_with_wandb_reader(logged):
    record = json.loads((logged / "trackers.json").read_text())["wandb"]
    assert record["mode"] == "offline"
    folders = sorted(logged.glob("wandb/offline-run-*"))
    assert len(folders) == 3 and all(f.name.endswith(record["id"]) for f in folders)  # train, resume, re-evaluation
    records = _wandb_records(logged)
    assert {r["run"]["run_id"] for r in records if r["type"] == "run"} == {record["id"]}
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    loss_steps = [h["_step"] for h in history if "train/loss_step" in h]
    assert loss_steps == [1, 2, 3, 4]
    assert [h["_step"] for h in history if "val/mean_ece" in h] == [2, 4]
    summary = json.loads((logged / "eval/test/summary.json").read_text())
    test = next(h for h in history if "eval/test/mean_ece" in h)
    assert test["eval/test/mean_ece"] == pytest.approx(summary["mean_ece"]) and test["_step"] == 4
    assert any("eval/val/mean_ece" in h for h in history)
    config = {key: value for r in records if r["type"] in ("run", "config")
              for key, value in (r["run"] if r["type"] == "run" else r)["config"].get("update", {}).items()}
    assert config["optim.lr"] == pytest.approx(1e-3) and config["tag.loss"] == "ce"
    assert json.loads((folders[1] / "files/eval/test/summary.json").read_text())["mean_ece"] == summary["mean_ece"]


@needs_both
def test_csv_and_tensorboard_hold_each_step_once(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with open(logged / "csv/metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows if r["key"] == "train/loss_step"] == [1, 2, 3, 4]
    assert {r["key"] for r in rows} >= {"val/mean_ece", "eval/test/mean_ece", "eval/val/mean_ece"}
    with open(logged / "csv/params.csv", newline="") as f:
        params = dict(csv.reader(f))
    assert params["trainer.max_epochs"] == "2" and params["tag.loss"] == "ce"
    events = EventAccumulator(str(logged / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss_step")] == [1, 2, 3, 4]  # TensorBoard as before


@needs_both
def test_a_sweep_job_is_a_child_of_the_sweeps_parent_run(tmp_path, store):
    """What a sweep's jobs find in its folder (written before the first job by the SweepSummary callback)."""
    from mlflow.tracking import MlflowClient

    from mcseg.trackers import build_trackers, close_sweep, open_sweep, preset_node

    logger = {"mlflow": {**preset_node("mlflow"), "tracking_uri": store, "experiment_name": "sweeps"},
              "wandb": {**preset_node("wandb"), "mode": "offline"}}
    sweep = tmp_path / "multiruns/2026-01-01_00-00-00"
    open_sweep(logger, sweep)
    parent = json.loads((sweep / "trackers.json").read_text())
    assert parent["wandb"]["group"] == "2026-01-01_00-00-00"
    assert parent["wandb"]["_target_"] == "mcseg.trackers.wandb_tracker.WandbTracker"  # the class its record reopens
    jobs = [build_trackers({"mlflow": logger["mlflow"]}, sweep / f"{n}_seed={n}", sweep_dir=sweep,
                           run_name=f"{n}_seed={n}") for n in range(2)]
    for job in jobs:
        job.close()
    (sweep / "sweep_summary.json").write_text("{}")
    close_sweep(sweep, [sweep / "sweep_summary.json"])
    client = MlflowClient(tracking_uri=store)
    children = client.search_runs([parent["mlflow"]["experiment_id"]],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent['mlflow']['run_id']}'")
    assert sorted(r.info.run_name for r in children) == ["0_seed=0", "1_seed=1"]
    top = client.get_run(parent["mlflow"]["run_id"])
    assert top.info.status == "FINISHED" and top.info.run_name == "2026-01-01_00-00-00"
    assert [f.path for f in client.list_artifacts(top.info.run_id)] == ["sweep_summary.json"]


def test_a_tracker_that_fails_warns_once_and_the_run_goes_on(tmp_path, caplog):
    """A tracker raising (a locked database, a server that does not answer) is one warning naming it and the
    error; the others go on and the failure is recorded for the run's status."""
    from mcseg.trackers import Trackers
    from mcseg.trackers.base import Tracker, failures, reset_failures

    class Locked(Tracker):
        name = "mlflow"

        def scalars(self, values, step):
            raise RuntimeError("(sqlite3.OperationalError) database is locked\n[SQL: INSERT ...]")

    class Kept(Tracker):
        name = "csv"
        seen: list = []

        def scalars(self, values, step):
            self.seen.append(step)

    reset_failures()
    trackers = Trackers([Locked(), Kept()])
    with caplog.at_level(logging.WARNING):
        for step in (1, 2, 3):
            trackers.scalars({"train/loss": 1.0}, step)
        trackers.close()
    warned = [r.getMessage() for r in caplog.records if "tracker" in r.getMessage()]
    assert warned == ["tracker mlflow failed (RuntimeError: (sqlite3.OperationalError) database is locked); it is "
                      "off for the rest of this run, which goes on (its folder stays the record)"]
    assert Kept.seen == [1, 2, 3] and trackers.names == ["csv"]
    assert failures() == [{"tracker": "mlflow", "error": "RuntimeError: (sqlite3.OperationalError) database is locked"}]
    reset_failures()


@pytest.mark.usefixtures("mlflow_installed")
def test_a_store_that_cannot_be_opened_is_recorded_in_the_runs_status(tmp_path, caplog, monkeypatch):
    """A real failure at start (the store's folder cannot be made: a file is in its way): the run completes,
    the CSV tracker beside it logs everything, and status.json names the tracker and the error."""
    from mcseg import sweep
    from mcseg.train import train

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "blocked").write_text("a file, not a folder")
    run = tmp_path / "run"
    cfg = compose_config("train", TINY_2D + ["logger=[csv,mlflow]", "trainer.max_epochs=1",
                                             f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/blocked/mlflow.db"], run)
    with caplog.at_level(logging.WARNING):
        assert sweep.run_job(train, cfg, checks_itself=True)["test/mean_ece"] is not None
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed"
    [failure] = status["tracker_failures"]
    assert failure["tracker"] == "mlflow" and "blocked" in failure["error"]
    assert sum("tracker mlflow failed" in r.getMessage() for r in caplog.records) == 1
    assert "eval/test/mean_ece" in (run / "csv/metrics.csv").read_text()


def test_logger_group_composes_each_tracker_and_lists_of_them(tmp_path, monkeypatch):
    from mcseg import trackers
    from mcseg.config import check_logger
    from mcseg.errors import ConfigError

    def chosen(*overrides):
        cfg = compose_config("train", list(overrides), tmp_path / "run")
        return trackers.enabled(cfg.logger), check_logger(cfg.logger), cfg.logger

    assert chosen()[0] == ["tensorboard"]  # the default, as before
    assert chosen("logger=none")[0] == [] and chosen("logger=none")[1].images == 0
    assert chosen("logger=[tensorboard,mlflow]")[0] == ["tensorboard", "mlflow"]
    names, typed_cfg, node = chosen("logger=[csv,wandb]", "logger.wandb.mode=online")
    assert names == ["csv", "wandb"] and node.wandb.mode == "online" and typed_cfg.images == 2
    assert chosen("logger=mlflow")[2].mlflow.tracking_uri == "sqlite:///outputs/mlflow.db"
    with pytest.raises(ConfigError, match="logger.wandb.mode"):
        chosen("logger=wandb", "logger.wandb.mode=sometimes")
    with pytest.raises(ConfigError, match=r"'logger.tensorboard.dir' is not a parameter of .*TensorBoardTracker"):
        chosen("+logger.tensorboard.dir=tb")  # a tracker without settings takes none
    with pytest.raises(ConfigError, match=r"config key 'logger.mlflow.tracking_ur' is not a parameter"):
        chosen("logger=mlflow", "+logger.mlflow.tracking_ur=x")
    with pytest.raises(ConfigError, match=r"config key 'logger.extra': expected a tracker node with a _target_"):
        chosen("+logger.extra=1")
    with_wandb = chosen("logger=[tensorboard,wandb]")[2]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"logger=mlflow needs the mlflow library: pip install .*\[mlflow\]"):
        trackers.build_trackers({"mlflow": trackers.preset_node("mlflow")}, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"logger=wandb needs the wandb library: pip install .*\[wandb\]"):
        trackers.check_libraries(with_wandb)  # what build_run asks before anything is written


@pytest.mark.slow
@needs_both
def test_a_two_job_sweep_is_one_parent_run_with_a_child_per_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    store = f"sqlite:///{tmp_path}/mlflow.db"
    done = run_cli("train.py", ["-m", *TINY_2D, "seed=0,1", "logger=[mlflow,wandb]", f"logger.mlflow.tracking_uri={store}",
                                f"hydra.sweep.dir={sweep_dir}"], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    parent = json.loads((sweep_dir / "trackers.json").read_text())
    client = MlflowClient(tracking_uri=store)
    top = client.get_run(parent["mlflow"]["run_id"])
    assert top.info.status == "FINISHED" and top.info.run_name == sweep_dir.name
    assert {f.path for f in client.list_artifacts(top.info.run_id)} == {"sweep_summary.json", "sweep_summary.md"}
    children = client.search_runs([parent["mlflow"]["experiment_id"]],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{top.info.run_id}'")
    assert sorted(r.data.params["seed"] for r in children) == ["0", "1"]
    assert all(r.info.status == "FINISHED" and "eval/test/mean_ece" in r.data.metrics for r in children)
    for job in sorted(p for p in sweep_dir.iterdir() if (p / "result.json").is_file()):
        record = json.loads((job / "trackers.json").read_text())
        assert record["wandb"]["group"] == sweep_dir.name
        assert record["mlflow"]["run_id"] in {r.info.run_id for r in children}


def _open_mlflow_only(settings: dict, run_dir: Path, limit_s: float = 30.0):
    """``build_trackers`` with MLflow (``settings``) and CSV on, in a thread given ``limit_s`` seconds: the trackers
    built (None: still retrying), the seconds taken and the warnings logged."""
    import threading
    import time

    from mcseg.trackers import build_trackers, preset_node

    built: dict = {}
    thread = threading.Thread(target=lambda: built.update(trackers=build_trackers(
        {"mlflow": {**preset_node("mlflow"), **settings}, "csv": preset_node("csv")}, run_dir)), daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(limit_s)
    return built.get("trackers"), time.monotonic() - start


@pytest.mark.usefixtures("mlflow_installed")
@pytest.mark.parametrize("server", ["refusing", "silent"])
def test_an_unreachable_tracking_server_is_one_warning_at_start_not_minutes_of_retries(tmp_path, caplog, server):
    """Issue #43 section 3: logger.mlflow.tracking_uri=http://127.0.0.1:9 stalled the run about 4 minutes in the
    client's retries before its first step. One short probe: one warning, the run goes on without MLflow, and
    status.json's tracker_failures names it. ``silent``: a loopback socket that accepts and never answers."""
    import socket

    from mcseg.trackers.base import failures, reset_failures

    reset_failures()
    listener = socket.socket()
    try:
        if server == "silent":
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
        else:
            uri = "http://127.0.0.1:9"  # the discard port: nothing listens
        with caplog.at_level(logging.WARNING):
            trackers, took = _open_mlflow_only({"tracking_uri": uri}, tmp_path / "run")
    finally:
        listener.close()
    assert trackers is not None, "still retrying after 30 s"
    assert took < 15 and trackers.names == ["csv"]
    [failure] = failures()
    assert failure["tracker"] == "mlflow" and f"logger.mlflow.tracking_uri={uri}" in failure["error"]
    assert sum("tracker mlflow failed" in r.getMessage() for r in caplog.records) == 1
    reset_failures()


@pytest.mark.usefixtures("mlflow_installed")
def test_a_read_only_store_is_reported_with_its_path_not_sqlalchemys_autoflush_hint(tmp_path, monkeypatch):
    """A read-only mlflow.db was reported as "(raised as a result of Query-invoked autoflush; consider using a
    session.no_autoflush block ...)". Now the cause and the file. (The tests may run as root, whom the OS lets
    write a read-only file: the file is made unwritable through os.access, which is what a user's process sees.)"""
    from mcseg.trackers.base import failures, reset_failures

    reset_failures()
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    db.write_bytes(b"")  # an empty SQLite database
    db.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **kw: False if Path(path) == db and mode & os.W_OK
                        else real_access(path, mode, *a, **kw))
    trackers, _ = _open_mlflow_only({"tracking_uri": f"sqlite:///{db}"}, tmp_path / "run")
    assert trackers is not None and trackers.names == ["csv"]
    [failure] = failures()
    assert f"{db}" in failure["error"] and "not writable" in failure["error"]
    assert "autoflush" not in failure["error"]
    reset_failures()


class ToyTracker(Tracker):
    """A tracker added by this class and one config node (README, "Extending mcseg"): it keeps what it is sent."""

    name = "toy"
    received: list = []  # (evaluation name, figures, step, prefix), in the order they came

    def __init__(self, prefix: str = "eval"):
        self.prefix = prefix

    def evaluation(self, name, metrics, files, step, hparams=None):
        ToyTracker.received.append((name, metrics, step, self.prefix))

    def record(self):
        return {}  # nothing to say where, but kept: a re-evaluation reopens it by its record


def test_a_record_without_its_class_reopens_the_preset_of_its_name(tmp_path):
    """A trackers.json written before trackers recorded their class: each name finds configs/logger/<name>.yaml."""
    from mcseg.trackers import reopen_trackers

    (tmp_path / "trackers.json").write_text(json.dumps({"csv": {"dir": str(tmp_path / "csv")}, "step": 3}))
    trackers = reopen_trackers(tmp_path)
    assert trackers.names == ["csv"] and trackers.trackers[0].dir == tmp_path / "csv"


def test_a_tracker_is_one_class_and_one_config_node(tmp_path, monkeypatch):
    """Issue #44: a tracker is a class and a ``_target_`` node (no list of names, no schema in config.py); an
    evaluation's figures reach it, a re-evaluation reopens it from trackers.json, its settings are checked at start."""
    from mcseg.config import check_logger
    from mcseg.errors import ConfigError
    from mcseg.evaluate import evaluate
    from mcseg.train import train

    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MCSEG_EXTRA_TARGETS", "tests.test_trackers.")  # a target outside mcseg is the user's choice
    toy = ["+logger.toy._target_=tests.test_trackers.ToyTracker", "+logger.toy.prefix=mine"]
    run = tmp_path / "run"
    ToyTracker.received.clear()
    train(compose_config("train", TINY_2D + ["logger=none", "trainer.max_epochs=1", *toy], run))
    [(name, figures, step, prefix)] = ToyTracker.received
    summary = json.loads((run / "eval/test/summary.json").read_text())
    assert name == "test" and prefix == "mine" and step > 0
    assert figures["mean_foreground_dice"] == summary["mean_foreground_dice"]
    assert figures["mean_ece"] == summary["mean_ece"]
    assert json.loads((run / "trackers.json").read_text())["toy"] == {"_target_": "tests.test_trackers.ToyTracker"}
    evaluate(compose_config("evaluate", [f"ckpt={run}", "split=val"], tmp_path / "evaluate"))
    assert [r[0] for r in ToyTracker.received] == ["test", "val"]  # eval/val of the run
    val = json.loads((run / "eval/val/summary.json").read_text())
    assert ToyTracker.received[1][1]["mean_foreground_dice"] == val["mean_foreground_dice"]
    with pytest.raises(ConfigError, match=r"config key 'logger.toy.prefx' is not a parameter of .*ToyTracker"):
        check_logger(compose_config("train", ["+logger.toy._target_=tests.test_trackers.ToyTracker",
                                              "+logger.toy.prefx=x"], tmp_path / "bad").logger)
    with pytest.raises(ConfigError, match=r"config key 'logger.toy.prefix'=3: expected a string"):
        check_logger(compose_config("train", [*toy[:1], "+logger.toy.prefix=3"], tmp_path / "bad").logger)
    ToyTracker.received.clear()

"""`mlflow server` from mcseg's own environment (the full `mlflow` of the `mlflow` extra, on the SQLAlchemy 2 that
Optuna's storage uses too) serves a run that mcseg's MLflow tracker logged into the SQLite store: its metrics read
back through MLflow's REST API, and the web UI's page."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import require


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


@pytest.fixture
def mlflow_server(tmp_path):
    """Starts `mlflow server` on a free localhost port against a store: ``serve(store) -> (base URL, process)``;
    stopped at the end. The store is written before: the server migrates a new database at start."""
    require("mlflow", "the mlflow extra (part of the test extra) brings `mlflow server`")
    started = []

    def serve(store: str):
        port = _free_port()
        started.append(subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store, "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--default-artifact-root", str(tmp_path / "artifacts")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        return f"http://127.0.0.1:{port}", started[-1]

    yield serve
    for server in started:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers: a session of their own
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _wait_until_up(url: str, server: subprocess.Popen, limit_s: float = 120.0) -> None:
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if server.poll() is not None:
            pytest.fail(f"mlflow server ended with {server.returncode}: {server.stdout.read()[-3000:]}")
        try:
            if _get(f"{url}/health")[0] == 200:
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server did not answer on {url} within {limit_s:.0f} s")


@pytest.mark.slow  # 20 s to a minute on 2 busy cores, most of it the server's start
def test_mlflow_server_from_mcsegs_environment_shows_a_runs_metrics(mlflow_server, tmp_path):
    from mcseg.trackers import build_trackers, preset_node

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # logged the way a training logs (mcseg's tracker, values sent at each flush), before the server reads the store
    trackers = build_trackers({"mlflow": {**preset_node("mlflow"), "tracking_uri": store, "experiment_name": "served"}},
                              tmp_path / "run")
    trackers.start({"loss": "margin", "loss.margin": 5}, {})
    for step, dice in ((1, 0.25), (2, 0.5)):
        trackers.scalars({"val/mean_foreground_dice": dice}, step)
        trackers.flush()
    trackers.save_record(2)
    trackers.close()
    run_id = json.loads((tmp_path / "run" / "trackers.json").read_text())["mlflow"]["run_id"]

    url, server = mlflow_server(store)
    _wait_until_up(url, server)
    status, text = _get(f"{url}/api/2.0/mlflow/runs/get?run_id={run_id}")
    run = json.loads(text)["run"]
    assert status == 200 and run["info"]["status"] == "FINISHED"
    assert {m["key"]: m["value"] for m in run["data"]["metrics"]} == {"val/mean_foreground_dice": 0.5}
    assert {p["key"]: p["value"] for p in run["data"]["params"]}["loss.margin"] == "5"
    history = json.loads(_get(f"{url}/api/2.0/mlflow/metrics/get-history?run_id={run_id}"
                              f"&metric_key=val/mean_foreground_dice")[1])["metrics"]
    assert [(m["step"], m["value"]) for m in history] == [(1, 0.25), (2, 0.5)]
    status, page = _get(f"{url}/")  # the web UI that docs/trackers.md sends users to
    assert status == 200 and "<title>MLflow</title>" in page

"""MLflow as a tracker (``logger=mlflow``).

The store is a SQLite database in the output folder by default (``sqlite:///outputs/mlflow.db``, relative to
the launch folder, made absolute; artefacts beside it in ``mlartifacts/``), which ``mlflow ui
--backend-store-uri sqlite:///outputs/mlflow.db`` opens; ``logger.mlflow.tracking_uri=`` points at a lab's
server instead. The run's id, store and experiment are kept in ``<run>/trackers.json``: a resumed run and a
re-evaluation write to that run; a sweep's jobs are children of the sweep's parent run.

MLflow cannot delete a logged value, so values are held until the trainer writes ``last.pt`` (:meth:`flush`):
a run killed after a checkpoint loses what it logged since, and its resume logs those steps once.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from mcseg.trackers.base import Tracker

PARAM_VALUE_MAX = 6000  # MLflow's limit on a parameter's value (longer ones are cut, ending with "...")
_BATCH = 100  # parameters per log_batch call (MLflow's limit)
_BAD_KEY = re.compile(r"[^\w\-. /:]")


def store_uri(uri: str | None) -> str:
    """``uri`` with a relative SQLite path made absolute (the default: ``sqlite:///outputs/mlflow.db``)."""
    uri = uri or "sqlite:///outputs/mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = Path(uri.removeprefix("sqlite:///")).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{path}"
    return uri


def artifact_root(uri: str) -> str | None:
    """Where a SQLite store's experiments keep their artefacts: ``mlartifacts/`` beside the database."""
    if uri.startswith("sqlite:///"):
        return str(Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts")
    return None  # a server decides


PROBE_TIMEOUT_S = 5.0  # one try to reach a tracking server at start (its client retries for minutes otherwise)


def check_reachable(uri: str) -> None:
    """A tracking server (``http(s)://``) is asked once, with a short timeout, before its client's retries can stall
    the run for minutes; raises ``ConnectionError`` naming the key and the cause when it does not answer. Any HTTP
    answer (an error status too: a proxy, a login) counts as reachable; other stores are not probed."""
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(f"logger.mlflow.tracking_uri={uri}: no answer within {PROBE_TIMEOUT_S:g} s "
                              f"({reason})") from None


def check_writable(uri: str) -> None:
    """A SQLite store must be writable, the file and its folder (SQLite writes its journal beside it); raises
    ``PermissionError`` naming the file (else SQLAlchemy reports it with a hint about autoflush)."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///"))
    if path.exists() and not os.access(path, os.W_OK):
        raise PermissionError(f"MLflow store {path} is not writable (a read-only file): make it writable or set "
                              "logger.mlflow.tracking_uri to another store")
    if not os.access(path.parent, os.W_OK):
        raise PermissionError(f"MLflow store {path}: its folder is not writable (SQLite writes its journal there)")


def client_for(uri: str):
    """A client of the store ``uri``, checked first (:func:`check_reachable`, :func:`check_writable`)."""
    from mlflow.tracking import MlflowClient

    check_reachable(uri)
    check_writable(uri)
    return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str, uri: str) -> str:
    """The id of experiment ``name``, created if needed (two jobs creating it at once: the loser reads it)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    root = artifact_root(uri)
    try:
        return client.create_experiment(name, artifact_location=f"{root}/{name}" if root else None)
    except Exception:  # noqa: BLE001: created meanwhile by another job of the sweep
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


class MlflowTracker(Tracker):
    name, library, extra = "mlflow", "mlflow", "mlflow"

    def __init__(self, tracking_uri: str | None = "sqlite:///outputs/mlflow.db", experiment_name: str | None = None,
                 run_name: str | None = None, tags: dict | None = None):
        self.settings = {"tracking_uri": tracking_uri, "experiment_name": experiment_name, "run_name": run_name,
                         "tags": dict(tags or {})}

    def open(self, run_dir: Path, record=None, parent=None, run_name=None, resumed=False):
        settings = self.settings
        self.uri = store_uri((record or {}).get("tracking_uri") or settings.get("tracking_uri"))
        self.client = client_for(self.uri)
        self._pending: list[tuple[int, dict]] = []
        if record and record.get("run_id"):  # a resume or a re-evaluation: the run it belongs to
            self.run_id, self.experiment_id = record["run_id"], record.get("experiment_id")
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {str(k): str(v) for k, v in (settings.get("tags") or {}).items()}
        if parent and parent.get("run_id"):
            tags["mlflow.parentRunId"] = parent["run_id"]
            self.experiment_id = parent["experiment_id"]
        else:
            self.experiment_id = experiment_id(self.client, settings.get("experiment_name") or "mcseg", self.uri)
        tags["mcseg.run_dir"] = str(run_dir)
        run = self.client.create_run(self.experiment_id, run_name=settings.get("run_name") or run_name, tags=tags)
        self.run_id = run.info.run_id

    def start(self, params, tags):
        from mlflow.entities import Param, RunTag

        items = [Param(_key(k), _value(v)) for k, v in params.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + _BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag(_key(k), _value(v)) for k, v in tags.items()])

    def scalars(self, values, step):
        self._pending.append((step, values))

    def flush(self):
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        metrics = [Metric(_key(k), float(v), now, int(step)) for step, values in self._pending for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        self._pending = []

    def evaluation(self, name, metrics, files, step, hparams=None):
        self.flush()
        self.scalars({f"eval/{name}/{k}": v for k, v in metrics.items()}, step)
        self.flush()
        for path in files:
            self.client.log_artifact(self.run_id, str(path), f"eval/{name}")

    def record(self):
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.uri}

    def open_sweep(self, sweep_dir):
        return open_parent(self.settings, sweep_dir, sweep_dir.name)

    def close_sweep(self, record, files, status="FINISHED"):
        close_parent(record, files, status)

    def close(self, status="FINISHED"):
        if status == "FINISHED":
            self.flush()
        self._pending = []
        self.client.set_terminated(self.run_id, status)


def _key(key: str) -> str:
    return _BAD_KEY.sub("_", str(key))


def _value(value) -> str:
    text = str(value)
    return text if len(text) <= PARAM_VALUE_MAX else text[:PARAM_VALUE_MAX - 3] + "..."


def open_parent(settings: dict, sweep_dir: Path, name: str) -> dict:
    """A sweep's parent run (its jobs are its children); what ``<sweep>/trackers.json`` keeps of it."""
    uri = store_uri(settings.get("tracking_uri"))
    client = client_for(uri)
    exp = experiment_id(client, settings.get("experiment_name") or "mcseg", uri)
    run = client.create_run(exp, run_name=name, tags={"mcseg.sweep_dir": str(sweep_dir), "mcseg.kind": "sweep"})
    return {"run_id": run.info.run_id, "experiment_id": exp, "tracking_uri": uri}


def close_parent(record: dict, files: list[Path], status: str = "FINISHED") -> None:
    client = client_for(record["tracking_uri"])
    for path in files:
        client.log_artifact(record["run_id"], str(path))
    client.set_terminated(record["run_id"], status)

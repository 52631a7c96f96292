"""Experiment trackers behind one small interface (``logger=`` config group, issue #38).

The trainer, ``evaluate.py`` and sweeps talk to one :class:`Trackers` object and never know which trackers
are on: TensorBoard (the default), a CSV file, MLflow, wandb, or several (``logger=[tensorboard,mlflow]``).
Every tracker receives the same things:

* at the start of a run (:meth:`Tracker.start`): the resolved configuration as flat parameters
  (``loss.margin``, ``optim.lr``: the keys an override names, the report's configuration identity) and tags
  (the identity, the configuration's sha256, the code commit, library versions, the data's fingerprint);
* per epoch (:meth:`Tracker.scalars`): the training and validation scalars at the trainer's global step;
* per evaluation (:meth:`Tracker.evaluation`): the final figures of ``summary.json`` (Dice, HD95, ECE,
  classwise ECE, NLL, Brier, failure detection, robustness under shift) as ``eval/<split>/<metric>``, and the
  files a person opens (``summary.json``, the reliability diagrams, risk-coverage and shift figures).

Which run a tracker wrote to is kept in the run folder, ``trackers.json``: a resumed run, a re-evaluation
(``evaluate.py``) and the jobs of a sweep (its folder holds the parent's) write to the run they belong to.

A tracker that fails (a locked database, a server that does not answer, a full disk) never loses the run:
one warning names the tracker and the error, the tracker is off for the rest of the process's run, and the
failure is recorded (:func:`failures`, which :func:`mcseg.sweep.run_job` puts into ``status.json``). A tracking
server is probed once at start with a short timeout and a SQLite store checked to be writable
(:func:`mcseg.trackers.mlflow_tracker.client_for`): minutes of a client's retries, or SQLAlchemy's
message in place of the cause, are one warning naming the cause. A tracker
whose library is not installed is refused at start, naming the extra to install.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from mcseg.files import write_json
from mcseg.errors import ConfigError
from mcseg.trackers.base import Tracker, note_failure

log = logging.getLogger(__name__)

RECORD_FILE = "trackers.json"  # in a run folder: each tracker's run (MLflow run id, wandb id); in a sweep folder: the parent's
NAMES = ("tensorboard", "csv", "mlflow", "wandb")
# Summary keys logged as final figures (besides every numeric ``mean_*``), and the nested blocks flattened.
_NESTED = ("failure_detection", "posthoc")

class Trackers:
    """The trackers that are on, called as one. Every call reaches each tracker; one that raises is warned of
    once, recorded (:func:`failures`) and left out from then on."""

    def __init__(self, trackers: list[Tracker], run_dir: Path | None = None) -> None:
        self.trackers, self.run_dir = list(trackers), run_dir

    def __bool__(self) -> bool:
        return bool(self.trackers)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def _each(self, method: str, *args, **kwargs) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001: whatever a tracker raises, the run goes on
                self.failed(tracker, exc)

    def failed(self, tracker: Tracker, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        log.warning("tracker %s failed (%s); it is off for the rest of this run, which goes on (its folder "
                    "stays the record)", tracker.name, error)
        note_failure(tracker.name, error)
        if tracker in self.trackers:
            self.trackers.remove(tracker)
        try:
            tracker.close("FAILED")
        except Exception:  # noqa: BLE001: already warned of
            pass

    def start(self, params: dict, tags: dict) -> None:
        self._each("start", params, tags)

    def resume_at(self, step: int) -> None:
        self._each("resume_at", step)

    def scalars(self, values: dict[str, float], step: int) -> None:
        finite = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if finite:
            self._each("scalars", finite, step)

    def flush(self) -> None:
        self._each("flush")

    def figure(self, tag: str, fig, step: int) -> None:
        self._each("figure", tag, fig, step)

    def overlays(self, tag: str, cases: list, step: int) -> None:
        self._each("overlays", tag, cases, step)

    def evaluation(self, name: str, summary: dict, out_dir: Path | None, step: int, hparams: dict | None = None) -> None:
        """``summary`` (an evaluation's summary.json) and the files of ``out_dir`` a person would open."""
        self._each("evaluation", name, summary_metrics(summary), evaluation_files(out_dir), step, hparams)

    def save_record(self, step: int | None = None) -> None:
        """Each tracker's run in ``<run>/trackers.json`` (merged with what is there: a re-evaluation keeps it),
        and ``step``, the run's last global step (where a re-evaluation logs its figures)."""
        if self.run_dir is None:
            return
        records = {t.name: r for t in self.trackers if (r := t.record()) is not None}
        if not records:  # TensorBoard alone keeps nothing to reopen
            return
        if step is not None:
            records["step"] = int(step)
        write_json(self.run_dir / RECORD_FILE, {**read_record(self.run_dir), **records})

    def close(self, status: str = "FINISHED") -> None:
        self._each("close", status)


def read_record(folder: Path | None) -> dict:
    """``<folder>/trackers.json`` ({} when absent or unreadable)."""
    path = Path(folder) / RECORD_FILE if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("cannot read %s (%s): trackers start new runs", path, exc)
        return {}


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config or record as ``{"a.b.c": value}``; lists as their text (``[8, 16, 32]``)."""
    if isinstance(node, dict):
        if not node:
            return {prefix: "{}"} if prefix else {}
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(node, (list, tuple)):
        return {prefix: str(list(node))}
    return {prefix: node if node is None or isinstance(node, (bool, int, float, str)) else str(node)}


def config_params(container: dict) -> dict[str, Any]:
    """The resolved configuration as flat parameters, without Hydra's own node and where outputs go."""
    return {k: v for k, v in flatten({k: v for k, v in container.items() if k not in ("hydra",)}).items()
            if not k.startswith(("paths.", "logger."))}


def summary_metrics(summary: dict) -> dict[str, float]:
    """The final figures of an evaluation's summary: every numeric ``mean_*`` (Dice, HD95, ECE, classwise ECE,
    NLL, Brier, ...), failure detection per uncertainty map, each post-hoc scaler's figures, and the robustness
    scores under shift (``shift/<predictor>/<metric>/{overall,degradation}``) where a shift suite ran."""
    out = {k: float(v) for k, v in summary.items() if k.startswith("mean_") and _number(v)}
    for block in _NESTED:
        for key, value in flatten(summary.get(block) or {}).items():
            if _number(value) and not key.startswith("protocol."):
                out[f"{block}/{key.replace('.', '/')}"] = float(value)
    for predictor, metrics in ((summary.get("shift") or {}).get("predictors") or {}).items():
        for metric, scores in metrics.items():
            for score in ("overall", "degradation"):
                if _number(scores.get(score)):
                    out[f"shift/{predictor}/{metric}/{score}"] = float(scores[score])
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# The files of an evaluation folder that a person opens; the shift suite's figures sit in its own folder.
EVALUATION_FILES = ("summary.json", "provenance.json", "shift_summary.json", "shift_table.md", "calibration.json")


def evaluation_files(out_dir: Path | None) -> list[Path]:
    if out_dir is None or not Path(out_dir).is_dir():
        return []
    out_dir = Path(out_dir)
    files = [out_dir / name for name in EVALUATION_FILES if (out_dir / name).is_file()]
    files += sorted(out_dir.glob("*.png")) + sorted((out_dir / "shift").glob("*.png"))
    return files


def logger_settings(logger: dict | None, dataset_name: str | None) -> dict:
    """The resolved ``logger`` node with its defaults filled in: MLflow's experiment is the dataset's name."""
    settings = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (logger or {}).items()}
    if isinstance(settings.get("mlflow"), dict):
        settings["mlflow"]["experiment_name"] = settings["mlflow"].get("experiment_name") or dataset_name or "mcseg"
    return settings


def enabled(logger_cfg) -> list[str]:
    """The trackers a ``logger`` node turns on, in :data:`NAMES` order."""
    return [name for name in NAMES if (logger_cfg or {}).get(name) not in (None, False)]


def build_trackers(logger_cfg: dict, run_dir: Path, resumed: bool = False, sweep_dir: Path | None = None,
                   run_name: str | None = None, reopen: bool = False) -> Trackers:
    """The trackers ``logger_cfg`` (the resolved ``logger`` node) turns on, for the run in ``run_dir``.

    ``resumed`` or ``reopen`` (a re-evaluation): each reopens the run recorded in ``<run>/trackers.json``.
    ``sweep_dir``: the folder of the sweep this run is a job of (its ``trackers.json`` names the parent run).
    """
    record = read_record(run_dir) if (resumed or reopen) else {}
    parent = read_record(sweep_dir) if sweep_dir is not None else {}
    built = Trackers([], run_dir)
    for name in enabled(logger_cfg):
        settings = dict(logger_cfg[name]) if isinstance(logger_cfg[name], dict) else {}
        factory = _factory(name)
        try:
            built.trackers.append(factory(settings, run_dir, record.get(name), parent.get(name), run_name, resumed=resumed))
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001: a server that does not answer at start: the run goes on
            built.failed(_Named(name), exc)
    return built


def reopen_trackers(run_dir: Path, record: dict | None = None) -> Trackers:
    """The trackers a run logged to, reopened from its ``trackers.json`` (a re-evaluation): their record says
    where (MLflow's store and run id, wandb's id and mode, the CSV folder). TensorBoard keeps training only."""
    record = read_record(run_dir) if record is None else record
    names = [n for n in NAMES if n != "tensorboard" and isinstance(record.get(n), dict)]
    return build_trackers({n: {} for n in names}, run_dir, reopen=True)


class _Named(Tracker):
    def __init__(self, name: str) -> None:
        self.name = name


def _factory(name: str):
    if name == "tensorboard":
        from mcseg.trackers.tensorboard import TensorBoardTracker as factory
    elif name == "csv":
        from mcseg.trackers.csv_tracker import CSVTracker as factory
    elif name == "mlflow":
        _require("mlflow", "mlflow")
        from mcseg.trackers.mlflow_tracker import MlflowTracker as factory
    else:
        _require("wandb", "wandb")
        from mcseg.trackers.wandb_tracker import WandbTracker as factory
    return factory


def check_libraries(logger_cfg) -> None:
    """A ConfigError, before anything is written, for a tracker that is on but whose library is not installed."""
    for name in enabled(logger_cfg):
        if name in ("mlflow", "wandb"):
            _require(name, name)


def _require(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"logger={extra} needs the {module} library: pip install -c constraints-cpu.txt "
                          f"-e '.[{extra}]' (or drop logger={extra})")


def open_sweep(logger_cfg: dict, sweep_dir: Path) -> None:
    """A sweep's parent in each tracker that has one (MLflow: a parent run; wandb: a group named after the
    sweep folder), kept in ``<sweep>/trackers.json`` for its jobs. A tracker that fails is warned of; its jobs
    then log as runs of their own."""
    sweep_dir = Path(sweep_dir)
    record = read_record(sweep_dir)  # a sweep run again into its folder keeps its parent
    names = enabled(logger_cfg)
    if "mlflow" in names and "mlflow" not in record:
        _require("mlflow", "mlflow")
        from mcseg.trackers.mlflow_tracker import open_parent

        try:
            record["mlflow"] = open_parent(dict(logger_cfg["mlflow"] or {}), sweep_dir, sweep_dir.name)
        except Exception as exc:  # noqa: BLE001
            Trackers([]).failed(_Named("mlflow"), exc)
    if "wandb" in names and "wandb" not in record:
        record["wandb"] = {"group": (dict(logger_cfg["wandb"] or {})).get("group") or sweep_dir.name}
    if record:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_json(sweep_dir / RECORD_FILE, record)


def close_sweep(sweep_dir: Path, files: list[Path], status: str = "FINISHED") -> None:
    """End the sweep's parent runs, with the sweep's summary files as their artefacts."""
    record = read_record(sweep_dir).get("mlflow")
    if record:
        from mcseg.trackers.mlflow_tracker import close_parent

        try:
            close_parent(record, [p for p in files if Path(p).is_file()], status)
        except Exception as exc:  # noqa: BLE001
            Trackers([]).failed(_Named("mlflow"), exc)

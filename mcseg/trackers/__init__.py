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

A tracker is one class (a :class:`~mcseg.trackers.base.Tracker` subclass, its settings the keyword arguments of
its constructor) and one config node, ``configs/logger/<name>.yaml``: ``<name>: {_target_: <class>, ...}``.
:func:`build_trackers` instantiates every node of the ``logger`` config that has a ``_target_``, in the node's
order; there is no list of names. Which run a tracker wrote to is kept in the run folder, ``trackers.json``, under
the tracker's ``name`` with its class (``_target_``): a resumed run, a re-evaluation
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

import importlib
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcseg.files import write_json
from mcseg.errors import ConfigError
from mcseg.targets import check_targets
from mcseg.trackers.base import Tracker, note_failure

log = logging.getLogger(__name__)

RECORD_FILE = "trackers.json"  # in a run folder: each tracker's run (MLflow run id, wandb id); in a sweep folder: the parent's
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
        records = {t.name: {**r, "_target_": target_of(t)} for t in self.trackers if (r := t.record()) is not None}
        if not records:  # no tracker on, or none that keeps a record
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
    """The resolved ``logger`` node with its defaults filled in: a tracker's ``experiment_name: null`` (MLflow's)
    is the dataset's name."""
    settings = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (logger or {}).items()}
    for node in settings.values():
        if isinstance(node, dict) and "experiment_name" in node:
            node["experiment_name"] = node["experiment_name"] or dataset_name or "mcseg"
    return settings


def tracker_nodes(logger_cfg) -> dict[str, dict]:
    """The trackers a ``logger`` node turns on: each of its nodes that has a ``_target_``, in the node's order
    (``logger=[tensorboard,mlflow]`` composes one node per preset; ``images`` is not a tracker)."""
    return {str(k): dict(v) for k, v in (logger_cfg or {}).items()
            if isinstance(v, Mapping) and v.get("_target_")}


def enabled(logger_cfg) -> list[str]:
    """The names of the trackers a ``logger`` node turns on (:func:`tracker_nodes`)."""
    return list(tracker_nodes(logger_cfg))


def tracker_class(target: str, key: str) -> type[Tracker]:
    """The class a ``_target_`` names (inside the allow-list of :mod:`mcseg.targets`: a record or a shared config
    cannot run code); its library checked (:func:`require`)."""
    check_targets({"_target_": str(target)}, key)
    module, _, attr = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"config key '{key}._target_': cannot import {target!r} ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, Tracker)):
        raise ConfigError(f"config key '{key}._target_': {target} is not a Tracker (mcseg.trackers.base)")
    require(cls, key.removeprefix("logger."))
    return cls


def instantiate(node: dict, key: str) -> Tracker:
    """The tracker of one ``_target_`` node: its class called with the node's settings."""
    settings = {k: v for k, v in node.items() if not str(k).startswith("_")}
    return tracker_class(node["_target_"], key)(**settings)


def target_of(tracker: Tracker) -> str:
    return f"{type(tracker).__module__}.{type(tracker).__qualname__}"


def preset_node(name: str) -> dict:
    """The node of ``configs/logger/<name>.yaml`` ({} when there is none): where a record written before
    trackers named their class (a ``trackers.json`` without ``_target_``) finds it."""
    from omegaconf import OmegaConf

    from mcseg.config import CONFIG_DIR

    path = Path(CONFIG_DIR) / "logger" / f"{name}.yaml"
    node = OmegaConf.to_container(OmegaConf.load(path)).get(name) if path.is_file() else None
    return dict(node) if isinstance(node, dict) else {}


def build_trackers(logger_cfg: dict, run_dir: Path, resumed: bool = False, sweep_dir: Path | None = None,
                   run_name: str | None = None, reopen: bool = False) -> Trackers:
    """The trackers ``logger_cfg`` (the resolved ``logger`` node) turns on, for the run in ``run_dir``: each node
    with a ``_target_`` instantiated with its settings, then opened.

    ``resumed`` or ``reopen`` (a re-evaluation): each reopens the run recorded in ``<run>/trackers.json``.
    ``sweep_dir``: the folder of the sweep this run is a job of (its ``trackers.json`` names the parent run).
    """
    record = read_record(run_dir) if (resumed or reopen) else {}
    parent = read_record(sweep_dir) if sweep_dir is not None else {}
    built = Trackers([], run_dir)
    made = {key: instantiate(node, f"logger.{key}") for key, node in tracker_nodes(logger_cfg).items()}
    named: dict[str, str] = {}
    for key, tracker in made.items():  # before any opens: trackers.json keeps one record per name
        if tracker.name in named:
            raise ConfigError(f"config keys 'logger.{named[tracker.name]}' and 'logger.{key}' both make a tracker "
                              f"named {tracker.name!r} ({target_of(made[named[tracker.name]])}, "
                              f"{target_of(tracker)}): trackers.json keeps one run per name; give the class its own "
                              f"name or turn one node off")
        named[tracker.name] = key
    for tracker in made.values():
        try:
            tracker.open(run_dir, record.get(tracker.name), parent.get(tracker.name), run_name, resumed=resumed)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001: a server that does not answer at start: the run goes on
            built.failed(tracker, exc)
        else:
            built.trackers.append(tracker)
    return built


def recorded_nodes(record: dict) -> dict[str, dict]:
    """The trackers a ``trackers.json`` names, as ``_target_`` nodes without settings (their record says where)."""
    nodes = {}
    for name, entry in record.items():
        target = entry.get("_target_") or preset_node(name).get("_target_") if isinstance(entry, dict) else None
        if target:
            nodes[name] = {"_target_": target}
    return nodes


def reopen_trackers(run_dir: Path, record: dict | None = None) -> Trackers:
    """The trackers a run logged to, reopened from its ``trackers.json`` (a re-evaluation): each entry names its
    class and says where (MLflow's store and run id, wandb's id and mode, the CSV folder; TensorBoard: the run's
    folder)."""
    record = read_record(run_dir) if record is None else record
    return build_trackers(recorded_nodes(record), run_dir, reopen=True)


def check_libraries(logger_cfg) -> None:
    """A ConfigError, before anything is written, for a tracker that is on but whose library is not installed."""
    for key, node in tracker_nodes(logger_cfg).items():
        tracker_class(node["_target_"], f"logger.{key}")


def require(cls: type[Tracker], key: str) -> None:
    """A ConfigError naming the extra to install when ``cls``'s library (:attr:`Tracker.library`) is missing."""
    import importlib.util

    if cls.library and importlib.util.find_spec(cls.library) is None:
        extra = cls.extra or cls.library
        raise ConfigError(f"logger={key} needs the {cls.library} library: pip install -c constraints-cpu.txt "
                          f"-e '.[{extra}]' (or drop logger={key})")


def open_sweep(logger_cfg: dict, sweep_dir: Path) -> None:
    """A sweep's parent in each tracker that has one (:meth:`Tracker.open_sweep`; MLflow: a parent run; wandb: a
    group named after the sweep folder), kept in ``<sweep>/trackers.json`` for its jobs. A tracker that fails is
    warned of; its jobs then log as runs of their own."""
    sweep_dir = Path(sweep_dir)
    record = read_record(sweep_dir)  # a sweep run again into its folder keeps its parent
    for key, node in tracker_nodes(logger_cfg).items():
        tracker = instantiate(node, f"logger.{key}")
        if tracker.name in record:
            continue
        try:
            parent = tracker.open_sweep(sweep_dir)
        except Exception as exc:  # noqa: BLE001
            Trackers([]).failed(tracker, exc)
            continue
        if parent is not None:
            record[tracker.name] = {**parent, "_target_": target_of(tracker)}
    if record:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_json(sweep_dir / RECORD_FILE, record)


def close_sweep(sweep_dir: Path, files: list[Path], status: str = "FINISHED") -> None:
    """End the sweep's parent runs (:meth:`Tracker.close_sweep`), with the sweep's summary files as artefacts."""
    record = read_record(sweep_dir)
    for key, node in recorded_nodes(record).items():
        tracker = instantiate(node, f"logger.{key}")
        try:
            tracker.close_sweep(record[key], [p for p in files if Path(p).is_file()], status)
        except Exception as exc:  # noqa: BLE001
            Trackers([]).failed(tracker, exc)

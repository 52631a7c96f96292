"""The tracker interface (:class:`Tracker`) and the record of this job's tracker failures; what every tracker
implements (:mod:`mcseg.trackers` calls them as one).

A tracker is one class and one config node: ``configs/logger/<name>.yaml`` holds ``<name>: {_target_: <class>,
<settings>}``. Its constructor takes the settings as keyword arguments (each with a default and an annotation:
the config check, :func:`mcseg.config.check_target_keys`, names a misspelt key or a wrong type at start) and does
nothing else; :meth:`Tracker.open` then opens its run."""
from __future__ import annotations

from pathlib import Path
from typing import Any

_failures: list[dict] = []  # this process's tracker failures since the last reset (one job of a sweep at a time)


def failures() -> list[dict]:
    """The tracker failures of the running job: ``[{"tracker", "error"}]``."""
    return list(_failures)


def reset_failures() -> None:
    _failures.clear()


def note_failure(name: str, error: str) -> None:
    _failures.append({"tracker": name, "error": error})


class Tracker:
    """One tracker. A method may raise: :class:`Trackers` turns it into one warning and turns the tracker off."""

    name = "tracker"  # its key in trackers.json (the record a resume or re-evaluation reopens it by)
    library: str | None = None  # the module it needs (refused at start when not installed, naming the extra)
    extra: str | None = None  # the pip extra that installs it

    def __init__(self) -> None:
        """No settings (a subclass names its own as keyword arguments; the config check reads this signature,
        so a key the tracker does not take is refused at start)."""

    def open(self, run_dir: Path, record: dict | None = None, parent: dict | None = None,
             run_name: str | None = None, resumed: bool = False) -> None:
        """Open the run in ``run_dir``: ``record`` is what :meth:`record` kept of it (a resume, a re-evaluation),
        ``parent`` what :meth:`open_sweep` kept of the sweep it is a job of, ``run_name`` the run folder's name."""

    def open_sweep(self, sweep_dir: Path) -> dict | None:
        """A sweep's parent (an MLflow parent run, a wandb group) before its first job: what its jobs' ``parent``
        is (kept in ``<sweep>/trackers.json``), or None when this tracker has none."""
        return None

    def close_sweep(self, record: dict, files: list[Path], status: str = "FINISHED") -> None:
        """End the sweep's parent that :meth:`open_sweep` recorded, with the sweep's summary files."""

    def start(self, params: dict[str, Any], tags: dict[str, str]) -> None:
        """The run's flat configuration and its identity and provenance (a fresh run only, not a resume)."""

    def resume_at(self, step: int) -> None:
        """A resumed run logs from ``step`` on (before anything is logged)."""

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Finite scalars at the trainer's global step."""

    def flush(self) -> None:
        """The trainer wrote ``last.pt``: send what was held (trackers that cannot delete a value hold it until
        then, so a resumed run never logs a step twice)."""

    def figure(self, tag: str, fig, step: int) -> None:
        """A matplotlib figure during training (TensorBoard only; others keep the files of evaluations)."""

    def overlays(self, tag: str, cases: list, step: int) -> None:
        """Image/label/prediction overlays during training (TensorBoard only)."""

    def evaluation(self, name: str, metrics: dict[str, float], files: list[Path], step: int,
                   hparams: dict | None = None) -> None:
        """An evaluation's final figures (keys ``eval/<name>/<metric>``) and its files (under ``eval/<name>/``)."""

    def record(self) -> dict | None:
        """What ``trackers.json`` keeps to reopen this tracker's run (None: nothing to keep)."""
        return None

    def close(self, status: str = "FINISHED") -> None:
        """End the run as ``status`` (FINISHED, FAILED, KILLED)."""

"""The tracker interface (:class:`Tracker`) and the record of this job's tracker failures; what every tracker
implements (:mod:`mcseg.trackers` calls them as one)."""
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

    name = "tracker"

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

"""TensorBoard as a tracker: today's events in ``<run>/tensorboard`` (:mod:`mcseg.trackers.tb_logger`)."""
from __future__ import annotations

from pathlib import Path

from mcseg.evaluation.figure_table import summary_keys
from mcseg.trackers.base import Tracker, note_failure
from mcseg.trackers.tb_logger import TensorBoardLogger


class TensorBoardTracker(Tracker):
    """Scalars, validation overlays and reliability diagrams at the global step, the HParams view of the
    training's test evaluation, and the figures a re-evaluation draws (conformal overlays). TensorBoard's own
    full-disk handling (one warning) stays; its failure is recorded like any tracker's."""

    name = "tensorboard"

    def open(self, run_dir: Path, record=None, parent=None, run_name=None, resumed=False):
        self.tb = TensorBoardLogger(run_dir / "tensorboard")

    def _call(self, method: str, *args) -> None:
        was_on = self.tb.log_dir is not None
        getattr(self.tb, method)(*args)
        if was_on and self.tb.log_dir is None:
            note_failure(self.name, self.tb.error or "stopped")

    def resume_at(self, step: int) -> None:
        self.tb.resume_at(step)

    def scalars(self, values, step):
        self._call("scalars", values, step)

    def figure(self, tag, fig, step):
        self._call("figure", tag, fig, step)

    def overlays(self, tag, cases, step):
        self._call("overlays", tag, cases, step)

    def evaluation(self, name, metrics, files, step, hparams=None):
        if hparams is not None:  # the training's own test evaluation: TensorBoard's HParams view of a sweep's runs
            final = {f"final/test_{k}": metrics.get(k) for k in summary_keys("hparams")}
            self._call("hparams", hparams["params"], final | hparams.get("metrics", {}))

    def record(self):
        return {}  # its events are in <run>/tensorboard; kept so that a re-evaluation reopens it (its figures)

    def close(self, status="FINISHED"):
        self._call("close")



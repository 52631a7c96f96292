"""A CSV file as a tracker: ``<run>/csv/metrics.csv`` (step, key, value; one row per value) and
``<run>/csv/params.csv`` (key, value), readable by any spreadsheet or ``pandas.read_csv``."""
from __future__ import annotations

import csv
from pathlib import Path

from mcseg.trackers.base import Tracker

METRICS_FILE, PARAMS_FILE = "metrics.csv", "params.csv"


class CSVTracker(Tracker):
    """Rows appended as they come; a resumed run first drops the rows the interrupted run wrote at its
    resume step or later (as TensorBoard's purge does), so no step appears twice."""

    name = "csv"

    def __init__(self, dir: str = "csv"):  # noqa: A002: the config key (inside the run folder)
        self.folder = dir

    def open(self, run_dir: Path, record=None, parent=None, run_name=None, resumed=False):
        self.dir = Path((record or {}).get("dir") or run_dir / (self.folder or "csv"))

    def start(self, params, tags):
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / PARAMS_FILE, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["key", "value"])
            writer.writerows(sorted({**params, **{f"tag.{k}": v for k, v in tags.items()}}.items()))

    def resume_at(self, step):
        path = self.dir / METRICS_FILE
        if path.is_file():
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) < step]
            self._write(rows, "w")

    def scalars(self, values, step):
        self._write([{"step": step, "key": k, "value": v} for k, v in values.items()], "a")

    def evaluation(self, name, metrics, files, step, hparams=None):
        self._write([{"step": step, "key": f"eval/{name}/{k}", "value": v} for k, v in metrics.items()], "a")

    def _write(self, rows: list[dict], mode: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / METRICS_FILE
        header = mode == "w" or not path.is_file()
        with open(path, mode, newline="") as f:
            writer = csv.DictWriter(f, ["step", "key", "value"])
            if header:
                writer.writeheader()
            writer.writerows(rows)

    def record(self):
        return {"dir": str(self.dir)}

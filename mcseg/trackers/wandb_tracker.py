"""wandb as a tracker (``logger=wandb``).

Offline by default: nothing leaves the machine, the run's files go to ``<run>/wandb/offline-run-*`` and
``wandb sync <run>/wandb/offline-run-*`` uploads them later; ``logger.wandb.mode=online`` logs to the server at
once. The run's id is kept in ``<run>/trackers.json``: a resume or a re-evaluation continues that run id (a new
offline folder of the same id, which ``wandb sync`` merges); a sweep's jobs are one group, named after the
sweep's folder. Values are held until the trainer writes ``last.pt`` (:meth:`flush`), as for MLflow.
"""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Literal

from mcseg.trackers.base import Tracker


class WandbTracker(Tracker):
    name, library, extra = "wandb", "wandb", "wandb"

    def __init__(self, mode: Literal["offline", "online", "disabled"] = "offline", project: str = "mcseg",
                 entity: str | None = None, group: str | None = None, name: str | None = None,
                 tags: list[str] | None = None):
        # ``name`` is the wandb run's name (the class's own ``name`` is its key in trackers.json)
        self.settings = {"mode": mode, "project": project, "entity": entity, "group": group, "name": name,
                         "tags": list(tags or [])}

    def open(self, run_dir: Path, record=None, parent=None, run_name=None, resumed=False):
        import wandb

        settings = self.settings

        record = record or {}
        self.run_dir, self._pending = run_dir, []
        self.id = record.get("id") or uuid.uuid4().hex[:8]
        self.mode = settings.get("mode") or "offline"
        self.project = record.get("project") or settings.get("project") or "mcseg"
        self.group = record.get("group") or (parent or {}).get("group") or settings.get("group")
        self.run = wandb.init(
            id=self.id, resume=None if self.mode == "offline" else "allow", mode=self.mode, project=self.project, entity=settings.get("entity"),
            group=self.group, name=settings.get("name") or run_name, tags=list(settings.get("tags") or []) or None,
            dir=str(run_dir), settings=wandb.Settings(console="off", silent=True), reinit="finish_previous",
        )

    def start(self, params, tags):
        self.run.config.update({**params, **{f"tag.{k}": v for k, v in tags.items()}}, allow_val_change=True)

    def scalars(self, values, step):
        self._pending.append((step, values))

    def flush(self):
        for step, values in self._pending:
            self.run.log(dict(values), step=int(step))
        self._pending = []

    def evaluation(self, name, metrics, files, step, hparams=None):
        self.flush()
        values = {f"eval/{name}/{k}": v for k, v in metrics.items()}
        self.run.log(values, step=int(step))
        self.run.summary.update(values)
        for path in files:  # copied into the run's files (uploaded by wandb sync, or at the end when online)
            target = Path(self.run.dir) / "eval" / name / Path(path).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)

    def record(self):
        return {"id": self.id, "project": self.project, "mode": self.mode, "group": self.group,
                "dir": str(self.run_dir / "wandb")}

    def open_sweep(self, sweep_dir):
        return {"group": self.settings.get("group") or sweep_dir.name}

    def close(self, status="FINISHED"):
        if status == "FINISHED":
            self.flush()
        self._pending = []
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)

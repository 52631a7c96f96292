"""Hydra's submitit launchers, able to submit a sweep and return at once (``wait: false``).

Hydra's own launcher (``hydra_submitit_launcher``) waits for every job's result, so the sweep lives only as
long as the process that submitted it (Hydra #3058, #3201). With ``wait: true`` (the default) these classes are
Hydra's launchers unchanged. With ``wait: false`` the jobs are submitted the same way (one array, the same
callable, folder and parameters: Hydra's ``launch`` with ``map_array`` asked not to wait), each job's id,
submitit folder, overrides and run directory are appended to ``<sweep dir>/jobs.jsonl``
(:func:`mcseg.submitted.record_jobs`), and the launch returns; ``mcseg-sweep status DIR`` shows the jobs'
states, and the same command again with ``trainer.auto_resume=true`` continues the unfinished ones.

The Optuna sweeper needs each trial's value before it asks the next: it refuses ``wait: false`` at set-up.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
from omegaconf import open_dict

from mcseg.submitted import record_jobs
from mcseg.sweep import refuse_sweep

log = logging.getLogger(__name__)


class _Detachable:
    def __init__(self, wait: bool = True, **params: Any) -> None:
        super().__init__(**params)  # type: ignore[call-arg]
        self.wait = bool(wait)

    def setup(self, *, hydra_context, task_function, config) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)  # type: ignore[misc]
        if not self.wait and str(config.hydra.sweeper.get("_target_", "")).endswith("OptunaSweeper"):
            refuse_sweep(ValueError("hydra.launcher.wait=false: the Optuna sweeper asks each trial after the values of the "
                             "ones before; submit and go needs a sweeper that knows all its jobs (basic, study)"))

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        if self.wait:
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]
        import submitit

        submitted: list = []
        real_map_array = submitit.AutoExecutor.map_array

        def map_array(executor, fn, *iterables):  # Hydra's launch, its jobs kept instead of waited for
            jobs = real_map_array(executor, fn, *iterables)
            submitted.extend(jobs)
            return [_NoWait() for _ in jobs]

        submitit.AutoExecutor.map_array = map_array
        try:
            super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]
        finally:
            submitit.AutoExecutor.map_array = real_map_array
        sweep_dir = Path(str(self.config.hydra.sweep.dir))  # type: ignore[attr-defined]
        dirs = [self._job_dir(overrides, initial_job_idx + k) for k, overrides in enumerate(job_overrides)]
        record_jobs(sweep_dir, self._EXECUTOR, submitted, job_overrides, dirs,  # type: ignore[attr-defined]
                    initial_job_idx)
        log.info("submitted %d jobs (%s) without waiting: `mcseg-sweep status %s` shows their states",
                 len(submitted), ", ".join(j.job_id for j in submitted), sweep_dir)
        # to the sweeper: launched, no value (JobStatus.UNKNOWN is refused by JobReturn.return_value)
        return [JobReturn(overrides=list(o), status=JobStatus.COMPLETED) for o in job_overrides]

    def _job_dir(self, overrides: Sequence[str], num: int) -> str:
        """The job's run directory under the sweep directory, as its job will compose it."""
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))  # type: ignore
        with open_dict(cfg):
            cfg.hydra.job.num = num
        return str(cfg.hydra.sweep.subdir)


class _NoWait:
    """What Hydra's launch reads of a job it waits for (``results()``), answered at once."""

    def results(self) -> list:
        return [None]


class DetachableLocalLauncher(_Detachable, LocalLauncher):
    """``hydra/launcher=submitit_debug``: submitit's local executor (one process per job, all started at once)."""


class DetachableSlurmLauncher(_Detachable, SlurmLauncher):
    """``hydra/launcher=slurm``: SLURM through submitit."""

"""Hydra's joblib launcher over a pool of device slots (``hydra/launcher=slots``, configs/hydra/launcher/slots.yaml).

joblib runs the jobs in as many loky worker processes as there are slots (:func:`mcseg.slots.make_slots`); each
worker takes a slot and sets the job's ``CUDA_VISIBLE_DEVICES`` and thread count before the job runs
(:func:`mcseg.slots.take_slot`), then runs it as Hydra's joblib launcher does (its ``execute_job``). Scheduling
is joblib's: a worker whose job ended, failed or not, takes the next job, on the same slot. The slots are
checked when the launcher is set up, before any job starts.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from mcseg.slots import Slot, log_job, make_slots, take_slot
from mcseg.sweep import refuse_sweep

log = logging.getLogger(__name__)


class SlotLauncher(Launcher):
    """``gpus``: GPU ids (``null``: CPU slots); ``jobs_per_gpu``; ``cpu_slots`` (``null``: the CPUs this process
    may use over ``threads_per_job``); ``threads_per_job``; the rest goes to ``joblib.Parallel``."""

    def __init__(self, gpus: Any = None, jobs_per_gpu: int = 1, cpu_slots: int | None = None,
                 threads_per_job: int = 1, **joblib: Any) -> None:
        self.gpus = OmegaConf.to_container(gpus) if OmegaConf.is_config(gpus) else gpus
        self.jobs_per_gpu, self.cpu_slots, self.threads_per_job = jobs_per_gpu, cpu_slots, threads_per_job
        self.joblib = {k: v for k, v in joblib.items() if k != "n_jobs"}  # one worker per slot
        self.slots: list[Slot] = []

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        try:
            self.slots = make_slots(self.gpus, self.jobs_per_gpu, self.cpu_slots, self.threads_per_job)
        except ValueError as exc:  # before any job: one line, no sweep summary
            refuse_sweep(exc)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from joblib import Parallel, delayed

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info("Slots (%s) are launching %d jobs in %s", ", ".join(s.name for s in self.slots),
                 len(job_overrides), sweep_dir)
        for idx, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + idx, " ".join(filter_overrides(overrides)))
        state = Singleton.get_state()
        runs = Parallel(n_jobs=len(self.slots), backend="loky", **self.joblib)(
            delayed(run_in_slot)(self.slots, sweep_dir, initial_job_idx + idx, overrides, self.hydra_context,
                                 self.config, self.task_function, state)
            for idx, overrides in enumerate(job_overrides))
        return list(runs)


def run_in_slot(slots: list[Slot], sweep_dir: Path, idx: int, overrides: Sequence[str], hydra_context: HydraContext,
                config: DictConfig, task_function: TaskFunction, singleton_state: dict) -> JobReturn:
    """One job in this worker's slot (taken at its first job), logged to ``slots.jsonl``."""
    import os

    from hydra_plugins.hydra_joblib_launcher._core import execute_job

    slot = take_slot(slots, sweep_dir)
    start = time.time()
    ret = execute_job(idx, overrides, hydra_context, config, task_function, singleton_state)
    log_job(sweep_dir, {"job": idx, "slot": slot.name, "cuda_visible_devices": slot.cuda_visible_devices,
                        "threads": slot.threads, "pid": os.getpid(), "start": start, "end": time.time(),
                        "status": ret.status.name.lower()})
    return ret

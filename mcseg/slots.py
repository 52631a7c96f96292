"""Device slots of a sweep on one host (``hydra/launcher=slots``): which GPU or CPU share each parallel job gets.

A slot is one GPU (``gpus: [0, 1]``; ``jobs_per_gpu`` slots per GPU) or, on a machine without one, a share of the
CPUs (``cpu_slots`` slots of ``threads_per_job`` threads). The launcher runs the sweep's jobs through joblib with
as many worker processes as slots; each worker takes a free slot the first time it runs a job and keeps it for
its lifetime (CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when a process first touches it, so a worker could not
move to another GPU). Taking a slot is an exclusive ``flock`` on ``<sweep dir>/.slots/<slot>.lock``: the kernel
releases it when the worker ends, however it ends, so a slot is never held by a dead process and no two live
processes hold one slot. The job sees:

* ``CUDA_VISIBLE_DEVICES``: its GPU only (a GPU slot; ``gpus`` are indices into the sweep process's own
  ``CUDA_VISIBLE_DEVICES`` when it has one), or nothing (a CPU slot: ``""``);
* ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` and ``torch.set_num_threads``: ``threads_per_job``;
* ``MCSEG_SLOT``: the slot's name, recorded in the job's ``status.json`` and ``result.json`` (:func:`slot_record`).

Each job also appends one line to ``<sweep dir>/slots.jsonl``: its number, slot, process, start and end times
(``time.time()``) and Hydra status, so a sweep shows which job ran where and when.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

SLOT_ENV = "MCSEG_SLOT"
SLOT_DIR, SLOT_LOG = ".slots", "slots.jsonl"


@dataclass(frozen=True)
class Slot:
    name: str  # "gpu<id>" or "gpu<id>.<k>" (k-th job on that GPU), "cpu<k>"
    cuda_visible_devices: str  # what the job's CUDA_VISIBLE_DEVICES is set to ("" on a CPU slot)
    threads: int


def make_slots(gpus: list[int] | None, jobs_per_gpu: int, cpu_slots: int | None, threads_per_job: int,
               device_count: int | None = None, visible: str | None = None) -> list[Slot]:
    """The sweep's slots, checked before any job starts: a GPU id the machine does not show, a repeated one,
    or a count below 1 is a ValueError naming its ``hydra.launcher`` key.

    ``device_count`` (default ``torch.cuda.device_count()``) and ``visible`` (default the process's
    ``CUDA_VISIBLE_DEVICES``) are the GPUs this process sees; a slot's GPU is an index into them."""
    if jobs_per_gpu < 1 or threads_per_job < 1 or (cpu_slots is not None and cpu_slots < 1):
        raise ValueError(f"hydra.launcher: jobs_per_gpu={jobs_per_gpu}, threads_per_job={threads_per_job}, "
                         f"cpu_slots={cpu_slots}: each must be >= 1")
    if not gpus:
        if cpu_slots is None:
            from mcseg.runtime import available_cpus

            cpu_slots = max(1, available_cpus() // threads_per_job)
        return [Slot(f"cpu{k}", "", threads_per_job) for k in range(cpu_slots)]
    gpus = [int(g) for g in gpus]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"hydra.launcher.gpus={gpus}: a GPU is listed twice (more jobs per GPU: jobs_per_gpu)")
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    ids = [v.strip() for v in visible.split(",")][:device_count] if visible else [str(k) for k in range(device_count)]
    missing = [g for g in gpus if not 0 <= g < len(ids)]
    if missing:
        seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible else ""
        ids_hint = f"use ids 0..{device_count - 1}" if device_count else "no GPU here"
        raise ValueError(f"hydra.launcher.gpus={gpus}: GPU {missing[0]} does not exist: this process sees "
                         f"{device_count} CUDA device(s){seen}; {ids_hint}, or gpus=null for CPU slots")
    return [Slot(f"gpu{g}" + (f".{k}" if jobs_per_gpu > 1 else ""), ids[g], threads_per_job)
            for g in gpus for k in range(jobs_per_gpu)]


_taken: tuple[Slot, int] | None = None  # this process's slot and the descriptor holding its lock


def take_slot(slots: list[Slot], sweep_dir: Path, poll_s: float = 0.2) -> Slot:
    """This worker's slot: the one it took before, or the first free one (waiting while none is: a worker that
    is ending may still hold its lock). Sets the job's environment (module docstring)."""
    import fcntl

    global _taken
    if _taken is not None and _taken[0] in slots:
        return _taken[0]
    folder = Path(sweep_dir) / SLOT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        for slot in slots:
            fd = os.open(folder / f"{slot.name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if _taken is not None:  # another launch of the sweep, with other slots
                os.close(_taken[1])
            _taken = (slot, fd)
            _enter(slot)
            return slot
        time.sleep(poll_s)


def _enter(slot: Slot) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = slot.cuda_visible_devices
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(slot.threads)
    os.environ[SLOT_ENV] = slot.name
    import torch

    torch.set_num_threads(slot.threads)


def slot_record() -> dict | None:
    """What ``status.json`` and ``result.json`` record of the job's slot (None outside ``hydra/launcher=slots``)."""
    name = os.environ.get(SLOT_ENV)
    if not name:
        return None
    return {"name": name, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0), "pid": os.getpid()}


def log_job(sweep_dir: Path, record: dict) -> None:
    """Append one job's line to ``<sweep dir>/slots.jsonl`` (one ``write`` of a short line: whole under O_APPEND)."""
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(Path(sweep_dir) / SLOT_LOG, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)

"""A sweep submitted without waiting (``hydra.launcher.wait=false``): its record of jobs and ``mcseg-sweep status``.

The launcher (hydra_plugins/mcseg_submit_launcher) appends one line per submitted job to
``<sweep dir>/jobs.jsonl``: job number, scheduler job id, executor (``slurm``, ``local``), submitit folder,
overrides, run directory (relative to the sweep directory), host and time. A sweep submitted again (e.g. with
``trainer.auto_resume=true`` to continue its unfinished jobs) appends new lines; a job's latest line is its
current submission.

``mcseg-sweep status DIR`` lists each job with two states, the scheduler's and the run's:

* scheduler: SLURM's (submitit asks ``sacct``: PENDING, RUNNING, COMPLETED, TIMEOUT, ...), or for the local
  executor RUNNING while its process lives, then FINISHED (submitit wrote its result) or ENDED (killed);
* run: the job's ``status.json`` (running, completed, failed, interrupted, pruned; a ``running`` whose process
  is gone is ``interrupted``, :func:`mcseg.rundir.state_of`), or ``not started`` before it has one.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Sequence

JOBS_FILE = "jobs.jsonl"


def record_jobs(sweep_dir: Path, executor: str, jobs: Sequence, overrides: Sequence[Sequence[str]],
                dirs: Sequence[str], first_num: int) -> None:
    """Append the submitted ``jobs`` (submitit jobs, in launch order) to ``<sweep dir>/jobs.jsonl``."""
    from mcseg.files import atomic_write

    path = Path(sweep_dir) / JOBS_FILE
    old = path.read_text() if path.is_file() else ""
    now, host = time.strftime("%Y-%m-%dT%H:%M:%S"), socket.gethostname()
    lines = [json.dumps({"num": first_num + k, "job_id": str(job.job_id), "executor": executor,
                         "folder": str(job.paths.folder), "overrides": list(o), "dir": d, "host": host,
                         "submitted": now})
             for k, (job, o, d) in enumerate(zip(jobs, overrides, dirs))]
    atomic_write(path, lambda tmp: tmp.write_text(old + "".join(line + "\n" for line in lines)))


def read_jobs(sweep_dir: Path) -> list[dict]:
    """Each job's latest submission from ``<sweep dir>/jobs.jsonl``, by job number; a ValueError naming the
    file when there is none (not a sweep submitted with ``hydra.launcher.wait=false``)."""
    path = Path(sweep_dir) / JOBS_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist: {sweep_dir} is not a sweep submitted with "
                         "hydra.launcher.wait=false (a sweep that waited has its sweep_summary.md)")
    latest: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            latest[record["num"]] = record
    return [latest[n] for n in sorted(latest)]


def scheduler_state(job: dict) -> str:
    """The scheduler's state of one submitted job (module docstring)."""
    from submitit.core.utils import JobPaths

    from mcseg.rundir import holder_gone

    if job["executor"] == "slurm":
        from submitit.slurm.slurm import SlurmJob

        return str(SlurmJob(job["folder"], job["job_id"]).state)
    if not holder_gone({"pid": job["job_id"], "host": job["host"], "age_s": 0.0}):
        return "RUNNING" if job["host"] == socket.gethostname() else "UNKNOWN (another host)"
    return "FINISHED" if JobPaths(job["folder"], job["job_id"], 0).result_pickle.exists() else "ENDED"


def run_state(sweep_dir: Path, job: dict) -> str:
    """The run's state from its directory (module docstring)."""
    from mcseg.rundir import STATUS_FILE, state_of

    status = Path(sweep_dir) / job["dir"] / STATUS_FILE
    if not status.is_file():
        return "not started"
    return state_of(status.parent, json.loads(status.read_text()).get("status"))


def sweep_status(sweep_dir: Path) -> list[dict]:
    """Each submitted job with its ``scheduler`` and ``run`` states."""
    return [{**job, "scheduler": scheduler_state(job), "run": run_state(sweep_dir, job)}
            for job in read_jobs(sweep_dir)]


def main(argv: list[str] | None = None) -> int:
    """``mcseg-sweep status DIR [--json]``."""
    parser = argparse.ArgumentParser(prog="mcseg-sweep", description="Sweeps submitted without waiting.")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="each job's scheduler and run state (from DIR/jobs.jsonl)")
    status.add_argument("sweep_dir", type=Path)
    status.add_argument("--json", action="store_true", help="one JSON list instead of the table")
    args = parser.parse_args(argv)
    try:
        jobs = sweep_status(args.sweep_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(jobs, indent=1))
        return 0
    counts: dict[str, int] = {}
    print(f"{'job':>4}  {'id':<12} {'scheduler':<12} {'run':<12} dir")
    for job in jobs:
        counts[job["run"]] = counts.get(job["run"], 0) + 1
        print(f"{job['num']:>4}  {job['job_id']:<12} {job['scheduler']:<12} {job['run']:<12} {job['dir']}")
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The trainings of a piece of :mod:`study_pieces`: ``parallel`` at a time with one torch thread each, stopped with
SIGTERM on Ctrl-C (so they checkpoint), under a monitor of the machine's load."""
from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

log = logging.getLogger("study_pieces")


class LoadMonitor:
    """The machine's 1-minute load average before, every 30 s during, and after a piece."""

    def __init__(self) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(30):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])

    def record(self) -> dict:
        return {"before": round(self.samples[0], 2), "after": round(self.samples[-1], 2),
                "mean": round(statistics.mean(self.samples), 2), "max": round(max(self.samples), 2),
                "cores": os.cpu_count()}


def train_command(base: tuple[str, ...], arm: list[str], seed: int, run_dir: Path, dropout: float | None) -> list[str]:
    command = [sys.executable, str(ROOT / "train.py"), *base, *arm, f"seed={seed}", f"hydra.run.dir={run_dir}"]
    if dropout:
        command.append(f"model.dropout={dropout}")
    if (run_dir / "checkpoints" / "last.pt").exists():
        command.append("trainer.resume=true")  # cut short earlier: go on from its last epoch
    return command


def train_all(jobs: list[tuple[str, list[str], Path]], parallel: int) -> dict[str, float]:
    """Trains the runs that have no ``result.json`` yet, ``parallel`` at a time with one torch thread each
    (threads x processes <= cores); returns each run's wall seconds (:func:`job_seconds`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    seconds: dict[str, float] = {}
    pending = [(name, command, run_dir) for name, command, run_dir in jobs if not (run_dir / "result.json").exists()]
    running: list[tuple[str, subprocess.Popen, float, Path]] = []
    try:
        _train(pending, running, parallel, env)
    except KeyboardInterrupt:  # a Ctrl-C sent to this process alone would leave its trainings running
        stop_trainings([process for _, process, _, _ in running])
        raise
    for name, _, run_dir in jobs:  # the job's own record: also right for a run trained before this piece
        seconds[name] = job_seconds(run_dir)
    return seconds


def stop_trainings(processes: list[subprocess.Popen], wait_s: float = 120.0) -> None:
    """SIGTERM to each training still running (it writes its checkpoint at the next step and stops, marked
    interrupted, so that the next piece resumes it; never SIGINT: a training that already had the terminal's
    Ctrl-C would take a second one as "stop at once, without a checkpoint"), then wait for them; one that does not
    stop in ``wait_s`` is killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _train(pending: list, running: list, parallel: int, env: dict) -> None:
    """:func:`train_all`'s loop: start the pending trainings ``parallel`` at a time, wait for each to end."""
    while pending or running:
        while pending and len(running) < parallel:
            name, command, run_dir = pending.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log.info("train %s: %s", name, " ".join(command[1:]))
            out = open(run_dir.parent / f"{run_dir.name}.train.log", "a")
            running.append((name, subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT),
                            time.perf_counter(), run_dir))
        time.sleep(5)
        for item in list(running):
            name, process, start, run_dir = item
            if process.poll() is None:
                continue
            running.remove(item)
            if process.returncode != 0 or not (run_dir / "result.json").exists():
                raise RuntimeError(f"training {name} failed (exit {process.returncode}): see "
                                   f"{run_dir.parent / (run_dir.name + '.train.log')}")
            log.info("trained %s in %.0f s", name, time.perf_counter() - start)


def job_seconds(run_dir: Path) -> float:
    """A finished run's wall time (training, its validations, post-hoc fits and test evaluation), from its
    ``status.json``; 0 when it has none."""
    status = run_dir / "status.json"
    return float(json.loads(status.read_text()).get("wall_time_s") or 0.0) if status.is_file() else 0.0

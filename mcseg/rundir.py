"""Ownership of a run directory: one process at a time, nothing written before a launch is accepted.

A launch (:func:`mcseg.sweep.run_job`) first :func:`claim`\\ s its directory: it creates
``run.lock`` exclusively (host, pid, start time, SLURM job id) and touches it every
``HEARTBEAT_S`` seconds from a thread. A second launch fails at once naming the holder; a
holder that is dead (same host, pid gone), silent (no heartbeat for ``STALE_S``) or the same
SLURM job (a requeue) is reclaimed with a log line. Until the launch :func:`begin`\\ s (the
entry point's pre-flight checks passed), nothing else is written: Hydra's ``.hydra/`` record is
written here instead of by Hydra (``hydra.output_subdir: null``) and log records are held in
memory instead of the run's log file. A refused launch therefore leaves the directory
byte-identical. A resume keeps the original record and appends to ``.hydra/resumes.yaml``.

Run directories are found here too (:func:`find_run_dirs`), for sweeps, evaluations of ensembles and reports.
"""
from __future__ import annotations

import functools
import json
import logging
import logging.handlers
import math
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("mcseg")

LOCK_FILE = "run.lock"
STATUS_FILE = "status.json"  # a job's outcome, written by mcseg.sweep.run_job
HEARTBEAT_S = 30.0  # the lock file's mtime is refreshed this often while its holder lives
STALE_S = 600.0  # a lock not refreshed for this long belongs to a dead process (any host)
EMPTY_LOCK_S = 10.0  # a lock still empty this long after its creation was left by a killed writer
RECORD_DIR = ".hydra"
RESUMES_FILE = "resumes.yaml"
# Temporary files of atomic writes (mcseg.files.atomic_write: ".<stem>.<random><suffix>") left by a killed writer.
_ORPHAN_GLOB = ".*.*"


class LaunchRefused(ValueError):
    """The launch would change a run directory it must not (nothing was written); the message says what to do."""


class RunDirBusy(OSError):
    """Another live process owns the run directory; the message names it."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    try:  # a zombie (ended, not yet reaped by its parent, e.g. a killed child of a live process) has ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): what kill says
        return True


def read_lock(run_dir: Path) -> dict | None:
    """The holder recorded in ``run_dir/run.lock`` plus its heartbeat age (``age_s``); None without a lock."""
    path = Path(run_dir) / LOCK_FILE
    try:
        text, mtime = path.read_text(), path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:  # being written, or its writer was killed while writing
        holder = {}
    return {**holder, "age_s": time.time() - mtime}


def holder_gone(holder: dict) -> str | None:
    """Why the lock's holder no longer runs (a reason to reclaim), or None when it may be alive."""
    if holder["age_s"] > STALE_S:
        return f"no heartbeat for {holder['age_s']:.0f} s"
    if not holder.get("pid"):  # being written right now, or its writer was killed while writing it
        return f"empty lock {holder['age_s']:.0f} s old" if holder["age_s"] > EMPTY_LOCK_S else None
    if holder.get("host") == socket.gethostname():
        return None if _pid_alive(int(holder["pid"])) else f"process {holder['pid']} has ended"
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm and holder.get("slurm_job_id") == slurm:  # requeued onto another node; SLURM ended the old one
        return f"SLURM job {slurm} was requeued"
    return None


def describe_holder(holder: dict) -> str:
    slurm = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{slurm}, started {holder.get('started')}"


def remove_orphans(run_dir: Path) -> list[Path]:
    """Delete temporary files of atomic writes that a killed process left (e.g. ``checkpoints/.last.x8a.pt``)."""
    removed = []
    for sub in (run_dir, run_dir / "checkpoints", run_dir / RECORD_DIR):
        if sub.is_dir():
            for path in sub.glob(_ORPHAN_GLOB):
                if path.is_file() and path.name != LOCK_FILE:
                    path.unlink(missing_ok=True)
                    removed.append(path)
    if removed:
        log.warning("removed %d temporary file(s) left by a killed process: %s", len(removed),
                    ", ".join(str(p) for p in removed))
    return removed


class RunDir:
    """This process's ownership of a run directory (see the module docstring)."""

    def __init__(self, path: Path, record: dict | None = None) -> None:
        self.path = Path(path)
        self.lock = self.path / LOCK_FILE
        self.record = record or {}  # Hydra's configs as YAML text: config, hydra, overrides
        self.started = False
        self.on_begin: list = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held: logging.handlers.MemoryHandler | None = None
        self._file_handlers: list[logging.Handler] = []

    # ------------------------------------------------------------- lock
    def acquire(self) -> None:
        """Create the lock exclusively; reclaim it from a dead holder; else raise :class:`RunDirBusy`."""
        self.path.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
        for _ in range(3):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_lock(self.path)
                if holder is None:
                    continue  # released meanwhile
                reason = holder_gone(holder)
                if reason is None:
                    raise RunDirBusy(f"{self.path} is in use by {describe_holder(holder)} ({self.lock}); "
                                     "wait for it to end or use another run directory") from None
                log.warning("%s: reclaimed from %s (%s)", self.path, describe_holder(holder), reason)
                self.lock.unlink(missing_ok=True)
                continue
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(me) + "\n")
            except BaseException:  # e.g. a full disk: leave no empty lock behind
                self.lock.unlink(missing_ok=True)
                raise
            self._thread = threading.Thread(target=self._heartbeat, name="run.lock heartbeat", daemon=True)
            self._thread.start()
            return
        raise RunDirBusy(f"{self.path}: could not take {self.lock} (other processes keep taking it)")

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.lock)
            except OSError:
                return

    def release(self) -> None:
        self._stop.set()
        holder = read_lock(self.path)
        if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            self.lock.unlink(missing_ok=True)
        self._restore_logging(flush=self.started)

    # ------------------------------------------------------------- logging and records
    def hold_logs(self) -> None:
        """Keep records meant for the run's log file in memory until :meth:`begin` (dropped on a refusal)."""
        root = logging.getLogger()
        self._file_handlers = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
        if not self._file_handlers:
            return
        for handler in self._file_handlers:
            handler.handleError = _quiet_failure(handler)
        for handler in self._file_handlers:
            root.removeHandler(handler)
        self._held = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)
        root.addHandler(self._held)

    def _restore_logging(self, flush: bool) -> None:
        if self._held is None:
            return
        root = logging.getLogger()
        root.removeHandler(self._held)
        for handler in self._file_handlers:
            root.addHandler(handler)
            if flush:
                for record in self._held.buffer:
                    if record.levelno >= handler.level:
                        handler.handle(record)
        self._held.buffer.clear()
        self._held = None

    def begin(self, resumed: bool) -> None:
        """The launch is accepted: write the record (or append to the resume history) and start logging to file."""
        if self.started:
            return
        self.started = True
        self._restore_logging(flush=True)
        remove_orphans(self.path)
        records = self.path / RECORD_DIR
        if self.record:
            from mcseg.files import atomic_write

            if resumed and (records / "config.yaml").is_file():
                import yaml

                history = records / RESUMES_FILE
                entries = (yaml.safe_load(history.read_text()) if history.is_file() else None) or []
                entries.append({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
                                "pid": os.getpid(), "overrides": self.record.get("overrides_list", [])})
                text = yaml.safe_dump(entries, sort_keys=False)
                atomic_write(history, lambda tmp: tmp.write_text(text))
            else:
                for name in ("config", "hydra", "overrides"):
                    atomic_write(records / f"{name}.yaml", lambda tmp, n=name: tmp.write_text(self.record[n]))
        for callback in self.on_begin:
            callback()


def _quiet_failure(handler: logging.FileHandler):
    """A log file that cannot be written (full disk) says so once and is dropped, instead of printing a
    traceback for every record; the error that follows names the path again."""

    def handle_error(record: logging.LogRecord) -> None:
        logging.getLogger().removeHandler(handler)
        import sys

        print(f"warning: cannot write the log file {handler.baseFilename}; logging to it stopped", file=sys.stderr)

    return handle_error


_current: RunDir | None = None


def hydra_record(cfg) -> dict:
    """Hydra's three files (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``) as Hydra writes them."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.instance().cfg
    overrides = OmegaConf.to_container(hydra_cfg.hydra.overrides.task)
    return {"config": OmegaConf.to_yaml(cfg), "hydra": OmegaConf.to_yaml(hydra_cfg),
            "overrides": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task), "overrides_list": overrides}


def claim(path: Path, cfg=None) -> RunDir:
    """Own ``path`` for this process (see :class:`RunDir`); the entry point then calls :func:`begin`."""
    global _current
    owner = RunDir(path, hydra_record(cfg) if cfg is not None else None)
    owner.hold_logs()
    try:
        owner.acquire()
    except BaseException:
        owner._restore_logging(flush=False)
        raise
    _current = owner
    return owner


def release(owner: RunDir) -> None:
    global _current
    owner.release()
    if _current is owner:
        _current = None


def begin(resumed: bool = False) -> None:
    """Called by an entry point once its pre-flight checks passed: from here on it may write its run directory.

    A no-op when no launch claimed a directory in this process (a direct ``train(cfg)`` call, torchrun rank > 0).
    """
    if _current is not None:
        _current.begin(resumed)


@contextmanager
def held(path: Path):
    """Own ``path`` for the block (no records: another job, e.g. an evaluation, writing into a run).

    Re-entrant: a directory this process already owns is simply used.
    """
    path = Path(path).resolve()
    holder = read_lock(path)
    if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        yield
        return
    owner = RunDir(path)
    owner.acquire()
    owner.started = True
    try:
        yield
    finally:
        owner.release()


def holds_checkpoint_run(fn):
    """Decorate ``fn(cfg, ckpt_path, ...)``: hold the checkpoint's run directory (``<run>/checkpoints/x.pt``)
    while ``fn`` writes into it, so it never writes into a run that another process is training or evaluating."""

    @functools.wraps(fn)
    def wrapper(cfg, ckpt_path: Path, *args, **kwargs):
        ckpt_path = Path(ckpt_path)
        if ckpt_path.parent.name != "checkpoints":
            return fn(cfg, ckpt_path, *args, **kwargs)
        with held(ckpt_path.parent.parent):
            return fn(cfg, ckpt_path, *args, **kwargs)

    return wrapper


def state_of(run_dir: Path, status: str) -> str:
    """``status`` of a run as recorded, with a ``running`` whose holder is gone shown as ``interrupted``."""
    if status != "running":
        return status
    holder = read_lock(run_dir)
    return "interrupted" if holder is None or holder_gone(holder) else status


# What marks a job's or run's directory: Hydra's record, mcseg's status and result files, checkpoints.
RUN_MARKERS = (".hydra", STATUS_FILE, "result.json", "checkpoints")


def find_run_dirs(roots: list[Path]) -> list[Path]:
    """Job and run directories under (or equal to) each root, without duplicates, in job order.

    Directories below an ``eval/`` folder (evaluation jobs writing into a run) are not runs.
    """
    found: dict[Path, None] = {}
    for root in roots:
        root = Path(root).resolve()
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory")
        for marker in RUN_MARKERS:
            for hit in root.rglob(marker):
                if "eval" not in hit.parent.relative_to(root).parts:
                    found.setdefault(hit.parent, None)
    return sorted(found, key=_job_order)


def _job_order(run_dir: Path) -> tuple:
    """Sweep job directories (``<n>_...``) in job-number order, not string order (10 after 9)."""
    number, _, _ = run_dir.name.partition("_")
    return (str(run_dir.parent), int(number) if number.isdigit() else math.inf, run_dir.name)

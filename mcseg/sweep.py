"""Sweeps with Hydra's own machinery: job status files, a sweep summary, and study sweeps.

* :func:`run_job` runs one job (train or evaluate) and records ``status.json`` in its output
  directory. Inside a multirun a failing job is recorded as failed and the sweep goes on (a
  ``sys.exit`` would end every remaining job); a single run still exits with status 1.
* :class:`SweepSummary` is a Hydra callback: when a multirun ends, also when it ends early (SIGTERM,
  Ctrl-C, an exception), it collects the jobs' ``status.json`` files into ``sweep_summary.json`` /
  ``.md`` in the sweep directory and logs the failed jobs.
* The same sweep run again into its directory with ``trainer.auto_resume=true`` continues it: job
  directory names leave out the resume overrides, so each job finds its directory; a completed job
  is skipped (a log line names it), an interrupted one resumes from its ``last.pt``.
* The study sweeper (``hydra/sweeper=study``, in ``hydra_plugins/mcseg_study_sweeper`` where
  Hydra requires plugins to live) runs a union of grids, one per loss.
* The Optuna sweeper (``hydra/sweeper=optuna``, ``hydra_plugins/mcseg_optuna_sweeper``) launches one
  job per trial; a job its pruner stops (:mod:`mcseg.trials`) is recorded ``pruned``, not failed.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mcseg.files import atomic_write, json_text, write_json
from mcseg.errors import as_disk_full
from mcseg.identity import hydra_job
from mcseg.rundir import STATUS_FILE, find_run_dirs, state_of
from mcseg.slots import slot_record

log = logging.getLogger("mcseg")

SUMMARY_FILE = "sweep_summary.json"
EXIT_INTERRUPTED = 128  # + the signal's number (143: SIGTERM, 130: SIGINT), what schedulers and shells expect
# Errors that are the user's input, not a bug: one clear line and a non-zero exit.
# OSError covers a full disk and unwritable output directories (the message names the path).
USER_ERRORS = (ValueError, OSError, FloatingPointError)
# status.json is written padded with spaces to a multiple of this size, with at least STATUS_SPARE bytes to
# spare: on a full disk the run's outcome is then written over it in place, which needs no new space.
STATUS_BLOCK, STATUS_SPARE = 4096, 2048


def write_status(path: Path, record: dict) -> None:
    """Write ``status.json`` atomically, padded to keep its space reserved (``STATUS_BLOCK``); when that fails
    (a full disk), write ``record`` over the file in place, within its size. Raises when neither works."""
    text = json_text(record)
    size = -(-(len(text) + STATUS_SPARE) // STATUS_BLOCK) * STATUS_BLOCK
    try:
        atomic_write(path, lambda tmp: tmp.write_text(text + " " * (size - len(text))))
    except OSError:
        if not _overwrite_in_place(path, record):
            raise


def _overwrite_in_place(path: Path, record: dict) -> bool:
    """``record`` written over ``path`` without growing it (its error cut to fit); False when it cannot be."""
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            text = json_text(record)
            if len(text) > size and record.get("error"):
                error = record["error"]
                text = json_text({**record, "error": error[: max(0, len(error) - (len(text) - size) - 3)] + "..."})
            if len(text) > size:
                return False
            f.write((text + " " * (size - len(text))).encode())
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        return False
    return True


def run_job(fn: Callable[[DictConfig], Any], cfg: DictConfig, checks_itself: bool = False) -> Any:
    """Own ``<output_dir>`` (:mod:`mcseg.rundir`), call ``fn(cfg)``, record the outcome in ``status.json``.

    ``checks_itself``: ``fn`` makes its pre-flight checks and calls :func:`mcseg.rundir.begin` before
    writing (training); otherwise the directory is begun before ``fn`` runs. A launch refused before
    it began (directory in use, :class:`~mcseg.rundir.LaunchRefused`) writes nothing, not even
    ``status.json``. Returns ``fn``'s value, or ``None`` for a job that failed inside a multirun (an
    Optuna sweeper then marks the trial failed). ``MCSEG_TRACEBACK=1`` re-raises instead.
    Inside a multirun, a job that already completed (a sweep run again with ``trainer.auto_resume=true``:
    :class:`~mcseg.training.relaunch.RunFinished`) is skipped with a log line naming it, its directory
    untouched, and returns its recorded ``result.json``.

    A full disk ends the job with one line naming the file and the free space
    (:class:`~mcseg.errors.DiskFullError`), and ``failed`` with that cause goes over the space that
    ``status.json`` keeps reserved (:func:`write_status`).
    """
    from mcseg import rundir
    from mcseg.trackers.base import failures, reset_failures
    from mcseg.errors import TrainingInterrupted
    from mcseg.trials import TrialPruned

    multirun, overrides, num = hydra_job()
    # torchrun or a submitit task > 0: rank 0 owns the run directory's files. A single process is rank 0 without
    # importing torch (mcseg.training.distributed): train.py refuses a typo before that import (mcseg.cli)
    alone = int(os.environ.get("WORLD_SIZE", 1)) <= 1 and not os.environ.get("SUBMITIT_EXECUTOR")
    if not alone and not _is_main():
        from mcseg.training.relaunch import RunFinished

        try:
            return fn(cfg)
        except TrainingInterrupted as exc:  # rank 0 reports it; the exit status says why this rank ended
            sys.exit(EXIT_INTERRUPTED + exc.signum)
        except TrialPruned:  # rank 0 records it and hands it to the sweeper; this rank ends as a finished one
            return None
        except RunFinished as exc:
            if not multirun:
                raise
            return json.loads(exc.result.read_text())
    out_dir = Path(cfg.paths.output_dir)
    record = {"status": "running", "overrides": overrides, "job_num": num, "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if slot_record():  # hydra/launcher=slots: the GPU or CPU share the job ran on
        record["slot"] = slot_record()
    reset_failures()  # the trackers that fail in this job are recorded in its status
    start = time.perf_counter()
    unrecorded = []  # why status.json could not be updated (e.g. the full disk that ended the run)

    def finish(status: str, error: str | None = None) -> None:
        if not owner.started:  # refused before it began: the directory stays as it was
            return
        record.update(status=status, error=error, wall_time_s=round(time.perf_counter() - start, 1))
        if failures():  # the run went on without them; its folder is the record
            record["tracker_failures"] = failures()
        try:
            write_status(out_dir / STATUS_FILE, record)
        except OSError as exc:
            unrecorded.append(f"; {out_dir / STATUS_FILE} not updated ({exc.strerror or exc})")

    def fail(exc: BaseException) -> None:
        note = "".join(unrecorded)
        if multirun:
            if owner is not None and owner.started:
                log.error("job %s failed (%s: %s); the sweep goes on\n%s", num, type(exc).__name__, exc,
                          traceback.format_exc())
            print(f"error in job {num} ({' '.join(overrides)}): {exc}{note}", file=sys.stderr)
            return
        print(f"error: {exc}{note}", file=sys.stderr)
        sys.exit(1)

    owner = None
    try:
        owner = rundir.claim(out_dir, cfg)
    except OSError as exc:  # in use by a live process, or not writable: nothing was written
        return fail(exc)
    owner.on_begin.append(lambda: write_status(out_dir / STATUS_FILE, record))
    previous = _stop_on_sigterm()
    ignored_sigint = _stop_on_sigint()
    try:
        if not checks_itself:
            owner.begin(resumed=False)
        result = fn(cfg)
    except TrainingInterrupted as exc:  # stops a sweep too: the scheduler asked everything to end
        finish("interrupted", str(exc))
        log.warning("%s", exc)
        print(f"interrupted: {exc}", file=sys.stderr)
        _note_stop(f"job {num} was interrupted by {signal.Signals(exc.signum).name}")
        sys.exit(EXIT_INTERRUPTED + exc.signum)
    except TrialPruned as exc:  # the Optuna sweep's pruner stopped it: not a failure, and the sweep goes on
        finish("pruned", str(exc))
        raise  # to the sweeper, through Hydra's job return: it tells the study
    except KeyboardInterrupt:  # Ctrl-C outside the training loop, or a second one inside it
        finish("interrupted", "KeyboardInterrupt")
        print("interrupted: Ctrl-C (no checkpoint written since the last one)", file=sys.stderr)
        _note_stop(f"job {num} was interrupted by Ctrl-C")
        sys.exit(EXIT_INTERRUPTED + signal.SIGINT)
    except Exception as raised:
        if multirun and _run_finished(raised):  # nothing was written: the directory stays as it was
            log.info("job %s (%s) already completed: skipped (its results: %s)", num, out_dir.name, raised.result)
            return json.loads(raised.result.read_text())
        # a full disk anywhere (torch's writers raise a RuntimeError from it): one line, the file and the space left
        exc = as_disk_full(raised) or as_disk_full(raised, out_dir) or raised
        finish("failed", f"{type(exc).__name__}: {exc}")
        if os.environ.get("MCSEG_TRACEBACK"):
            _note_stop(f"job {num} failed and MCSEG_TRACEBACK=1 re-raised its error")
            raise
        if not multirun and not isinstance(exc, USER_ERRORS):
            raise
        if not multirun and owner.started:
            log.error("%s: %s", type(exc).__name__, exc)
        return fail(exc)
    else:
        finish("completed")
        return result
    finally:
        rundir.release(owner)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if ignored_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _is_main() -> bool:
    from mcseg.training.distributed import env_context

    return env_context().is_main


def _run_finished(exc: Exception) -> bool:
    """``exc`` is :class:`~mcseg.training.relaunch.RunFinished` (imported only then: training raised it)."""
    from mcseg.training.relaunch import RunFinished

    return isinstance(exc, RunFinished)


# Why this process's sweep is ending before its last job (read by SweepSummary at exit).
_stop_reason: str | None = None
REFUSED = "refused by its sweeper before its first job"  # a config error: nothing ran, nothing to continue
_made_sweep_dir: Path | None = None  # the sweep folder OutputDirCheck created (a refused sweep removes it if empty)


def _note_stop(reason: str) -> None:
    global _stop_reason
    _stop_reason = reason


def refuse_sweep(exc: BaseException) -> NoReturn:
    """End a sweep its sweeper refused before launching any job (a config error: a search space or a storage that
    cannot work): ``error: <exc>`` on stderr, one paragraph naming the key, and exit status 1, without Hydra's
    traceback. At exit :class:`SweepSummary` then writes no summary and gives no advice to continue the sweep
    (``trainer.auto_resume=true`` cannot help: nothing ran), and the sweep folder, if this launch made it and it is
    still empty, is removed. ``MCSEG_TRACEBACK=1`` re-raises instead (a launcher's or sweeper's setting: a GPU
    that does not exist, a storage that cannot be opened)."""
    if os.environ.get("MCSEG_TRACEBACK"):
        raise exc
    _note_stop(REFUSED)
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(1)


def _stop_on_sigterm():
    """Outside the training loop (which checkpoints first), SIGTERM ends the job through its error path,
    so the status is recorded and the run directory released. Returns the previous handler."""
    import threading

    from mcseg.errors import TrainingInterrupted

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise TrainingInterrupted("stopped by SIGTERM")

    return signal.signal(signal.SIGTERM, stop)


def _stop_on_sigint() -> bool:
    """A process started from a shell that ignores SIGINT (a script's background job) inherits SIG_IGN, and
    Python then leaves Ctrl-C ignored; the training loop installs its own handler and stops, so every job
    does: SIGINT raises KeyboardInterrupt for the job's duration. True when it was ignored (restored after)."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


def collect_job_status(sweep_dir: Path) -> list[dict]:
    """``status.json`` of every job directory under ``sweep_dir``."""
    sweep_dir = Path(sweep_dir).resolve()
    jobs = []
    for job_dir in find_run_dirs([sweep_dir]):
        path = job_dir / STATUS_FILE
        if path.is_file():
            record = json.loads(path.read_text())
            record["status"] = state_of(job_dir, record.get("status"))  # "running" with its process gone
        else:  # killed before it could write anything
            record = {"status": "missing", "error": f"no {STATUS_FILE}: the job never started or was killed"}
        jobs.append({"dir": str(job_dir.relative_to(sweep_dir)), **record})
    return jobs


def write_sweep_summary(sweep_dir: Path, ended_early: str | None = None) -> dict:
    """Write ``sweep_summary.json`` and ``sweep_summary.md`` for the jobs under ``sweep_dir``.

    ``ended_early``: why the sweep stopped before its last job (the summary then says how to continue it).
    """
    jobs = collect_job_status(sweep_dir)
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    summary = {"sweep_dir": str(sweep_dir), "counts": counts, "ended_early": ended_early, "jobs": jobs}
    write_json(Path(sweep_dir) / SUMMARY_FILE, summary)
    lines = [f"# Sweep {sweep_dir}", "", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no jobs", ""]
    if ended_early:
        lines += [f"The sweep ended early ({ended_early}); jobs that had not started are not listed. "
                  f"{continue_hint(sweep_dir, '`')}", ""]
    lines += ["| job | status | wall time (s) | overrides | error |", "|---|---|---|---|---|"]
    for job in jobs:
        error = (job.get("error") or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {job['dir']} | {job['status']} | {job.get('wall_time_s', '')} | "
                     f"{' '.join(job.get('overrides', []))} | {error} |")
    atomic_write(Path(sweep_dir) / "sweep_summary.md", lambda tmp: tmp.write_text("\n".join(lines) + "\n"))
    return summary


def continue_hint(sweep_dir: Path, quote: str = "") -> str:
    """How to continue a sweep that ended early (``quote``: "`" for markdown)."""
    q = quote
    return (f"To continue it, run the same command again with {q}trainer.auto_resume=true "
            f"hydra.sweep.dir={sweep_dir}{q}: completed jobs are skipped, interrupted ones resume from their "
            f"{q}last.pt{q}.")


class SweepSummary(Callback):
    """Hydra callback: summarise the sweep's jobs when the multirun ends (see :func:`write_sweep_summary`).

    Hydra calls ``on_multirun_end`` only when every job has returned; a sweep stopped by SIGTERM, Ctrl-C or
    an exception is summarised at the process's exit instead (``atexit``), saying that it ended early.
    SIGTERM, which would otherwise end the process without running exit handlers, is turned into an exit
    with status 143 while the sweep runs (jobs and the training loop install their own handlers meanwhile).
    """

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        import threading

        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        atexit.register(self._at_exit)
        _open_sweep_trackers(config, self.sweep_dir)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        atexit.unregister(self._at_exit)
        self._summarise(Path(str(config.hydra.sweep.dir)), None)

    def _at_exit(self) -> None:
        if _stop_reason == REFUSED:  # refused before its first job (refuse_sweep): no summary, no advice
            self._refused(self.sweep_dir)
            return
        try:
            self._summarise(self.sweep_dir, _stop_reason or "the process ended before its last job")
        except OSError as exc:  # e.g. the full disk that ended the sweep: one line, not a traceback at exit
            print(f"error: cannot write the sweep summary in {self.sweep_dir}: {exc.strerror or exc}", file=sys.stderr)

    @staticmethod
    def _refused(sweep_dir: Path | None) -> None:
        """A refused sweep: its trackers' parent runs (if any were opened) ended as failed; its folder removed when
        this launch made it and nothing was written into it."""
        if sweep_dir is None or not sweep_dir.is_dir():
            return
        from mcseg.trackers import close_sweep

        close_sweep(sweep_dir, [], "FAILED")
        if _made_sweep_dir is not None and sweep_dir.resolve() == _made_sweep_dir and not any(sweep_dir.iterdir()):
            sweep_dir.rmdir()

    @staticmethod
    def _summarise(sweep_dir: Path | None, ended_early: str | None) -> None:
        if sweep_dir is None or not sweep_dir.is_dir():
            return
        summary = write_sweep_summary(sweep_dir, ended_early)
        from mcseg.trackers import close_sweep

        close_sweep(sweep_dir, [sweep_dir / SUMMARY_FILE, sweep_dir / "sweep_summary.md"],
                    "KILLED" if ended_early else "FINISHED")
        failed = [j for j in summary["jobs"] if j["status"] not in ("completed", "pruned")]
        log.info("sweep %s: %s (summary in %s)", sweep_dir, summary["counts"], sweep_dir / SUMMARY_FILE)
        for job in failed:
            log.error("job %s %s: %s", job["dir"], job["status"], job.get("error"))
        if ended_early:
            log.warning("the sweep ended early (%s). %s", ended_early, continue_hint(sweep_dir))


def _open_sweep_trackers(config: DictConfig, sweep_dir: Path) -> None:
    """The trackers' parent run of a training sweep (mcseg.trackers.open_sweep), before its first job."""
    from omegaconf import OmegaConf

    from mcseg.trackers import logger_settings, open_sweep

    if "logger" not in config:  # an evaluation sweep: each job logs to the run it evaluates
        return
    logger = OmegaConf.to_container(config.logger, resolve=True)
    open_sweep(logger_settings(logger, str(config.get("dataset", {}).get("name") or "")), sweep_dir)


def _exit_on_sigterm(signum, frame):
    _note_stop("the sweep was stopped by SIGTERM")
    sys.exit(EXIT_INTERRUPTED + signum)


class OutputDirCheck(Callback):
    """Hydra callback: an output directory that cannot be created is one line naming it, not Hydra's traceback."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _creatable(Path(config.hydra.run.dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _made_sweep_dir
        path = Path(config.hydra.sweep.dir)
        made = not path.exists()
        _creatable(path)
        _made_sweep_dir = path.resolve() if made else None


def _creatable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(f"[Errno 13] Permission denied: '{path}'")
    except OSError as exc:
        print(f"error: cannot create the output directory {path}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(1)

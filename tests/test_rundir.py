"""A run directory has one owner, and a refused launch leaves it byte-identical (mcseg.rundir)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mcseg import rundir
from mcseg.config import resume_mismatch

from .conftest import TINY_2D, run_cli


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("finished") / "run"
    done = run_cli("train.py", TINY_2D + [f"hydra.run.dir={run}"])
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def snapshot(root: Path) -> dict:
    """Every file's bytes and mtime, and every directory's entries."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mtime_ns)
        else:
            out[str(path.relative_to(root))] = sorted(p.name for p in path.iterdir())
    return out


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("overrides, says", [
    (["loss=margin", "optim.lr=0.5"], "last.pt exists"),  # another config, no resume
    (["trainer.resume=true", "trainer.max_epochs=3"], "scheduler.total_iters=3"),  # a changed config on resume
    (["trainer.resume=true"], "finished run"),  # the same config: re-evaluating would overwrite the results
], ids=["new-config", "changed-resume", "finished-resume"])
def test_a_refused_launch_leaves_the_run_directory_byte_identical(finished_run, overrides, says):
    before = snapshot(finished_run)
    done = run_cli("train.py", TINY_2D + overrides + [f"hydra.run.dir={finished_run}"])
    assert done.returncode == 1
    lines = _error_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    assert snapshot(finished_run) == before


@pytest.mark.slow
def test_resume_with_another_dataset_config_is_refused(finished_run):
    before = snapshot(finished_run)
    done = run_cli("train.py", TINY_2D + ["trainer.resume=true", "dataset.normalization.scheme=none",
                                          f"hydra.run.dir={finished_run}"])
    assert done.returncode == 1 and "dataset.normalization.scheme" in done.stderr, done.stderr
    assert snapshot(finished_run) == before


def test_what_must_match_on_resume():
    saved = {"seed": 0, "model": {"channels": [8]}, "dataset": {
        "name": "msd", "root": "/old", "class_names": ["bg", "a"], "normalization": {"scheme": "zscore"},
        "preprocess": {"cache_dir": None, "target_spacing": None}, "sampling": {"num_workers": 0, "batch_size": 2}}}

    def changed(path: str, value) -> dict:
        now = json.loads(json.dumps(saved))
        *parents, leaf = path.split(".")
        node = now
        for name in parents:
            node = node[name]
        node[leaf] = value
        return now

    assert resume_mismatch(saved, saved) is None
    for may in ("dataset.root", "dataset.preprocess.cache_dir", "dataset.sampling.num_workers"):
        assert resume_mismatch(saved, changed(may, "/elsewhere")) is None, may
    for must in ("dataset.normalization.scheme", "dataset.preprocess.target_spacing", "dataset.sampling.batch_size",
                 "dataset.class_names", "model.channels", "seed"):
        assert resume_mismatch(saved, changed(must, 7)).startswith(must), must


def _hold(run: Path, pid: int, host: str | None = None, slurm: str | None = None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / rundir.LOCK_FILE).write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid,
                                                    "started": "2026-01-01T00:00:00", "slurm_job_id": slurm}))


def test_a_second_launch_into_an_owned_directory_fails_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    _hold(run, os.getpid())  # this test process: alive
    done = run_cli("train.py", TINY_2D + [f"hydra.run.dir={run}"])
    assert done.returncode == 1
    lines = _error_lines(done.stderr)
    assert len(lines) == 1 and f"pid {os.getpid()} on {socket.gethostname()}" in lines[0], done.stderr
    assert sorted(p.name for p in run.iterdir()) == [rundir.LOCK_FILE]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("holder", [
    {"pid": "dead"},  # same host, process gone
    {"pid": None, "stale": rundir.EMPTY_LOCK_S},  # its writer was killed before it wrote the holder
    {"pid": 1, "host": "elsewhere", "stale": rundir.STALE_S},  # another host, no heartbeat
    {"pid": 1, "host": "elsewhere", "slurm": "777"},  # the same SLURM job, requeued
], ids=["dead-pid", "empty-lock", "stale-heartbeat", "slurm-requeue"])
def test_a_dead_holder_is_reclaimed_and_the_lock_released_on_exit(tmp_path, monkeypatch, caplog, holder):
    run = tmp_path / "run"
    _hold(run, _dead_pid() if holder["pid"] == "dead" else holder["pid"], holder.get("host"), holder.get("slurm"))
    if holder["pid"] is None:
        (run / rundir.LOCK_FILE).write_text("")
    if holder.get("stale"):
        old = os.stat(run / rundir.LOCK_FILE).st_mtime - holder["stale"] - 1
        os.utime(run / rundir.LOCK_FILE, (old, old))
    if holder.get("slurm"):
        monkeypatch.setenv("SLURM_JOB_ID", holder["slurm"])
    with caplog.at_level("WARNING"):
        owner = rundir.claim(run)
    assert "reclaimed" in caplog.text
    assert json.loads((run / rundir.LOCK_FILE).read_text())["pid"] == os.getpid()
    with pytest.raises(rundir.RunDirBusy, match=f"pid {os.getpid()}"):
        rundir.claim(run)  # now held by a live process (this one)
    rundir.release(owner)
    assert not (run / rundir.LOCK_FILE).exists()


def _job_cfg(make_cfg, run: Path):
    return make_cfg(TINY_2D, output_dir=run)


@pytest.mark.parametrize("reserve", ["kept", "lost"])
def test_a_full_disk_is_one_line_naming_the_path_and_orphans_go_on_the_next_start(make_cfg, tmp_path, monkeypatch,
                                                                                  capsys, reserve):
    """The outcome goes over status.json's reserved space in place; where that is lost too (a copy-on-write
    file system needs new space for it), the line says that status.json was not updated."""
    import errno

    from mcseg import sweep

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    orphan = run / "checkpoints" / ".last.k2x9_a.pt"  # what a kill during a checkpoint write leaves
    orphan.write_bytes(b"")
    real_atomic_write = sweep.atomic_write

    def atomic_write(path, write_fn):  # the disk is full once status.json said "running"
        if (run / sweep.STATUS_FILE).exists():
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_atomic_write(path, write_fn)

    def train_on_a_full_disk(cfg):
        from mcseg.rundir import begin

        begin()
        if reserve == "lost":
            (run / sweep.STATUS_FILE).write_text("")
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "checkpoints" / "last.pt"))

    monkeypatch.setattr(sweep, "atomic_write", atomic_write)
    with pytest.raises(SystemExit) as stop:
        sweep.run_job(train_on_a_full_disk, _job_cfg(make_cfg, run), checks_itself=True)
    assert stop.value.code == 1
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "checkpoints/last.pt" in lines[0] and "free on its file system" in lines[0], lines
    if reserve == "kept":
        status = json.loads((run / sweep.STATUS_FILE).read_text())
        assert status["status"] == "failed" and "checkpoints/last.pt" in status["error"]
    else:
        assert "status.json not updated" in lines[0]
    assert not orphan.exists() and not (run / rundir.LOCK_FILE).exists()


class _FullDisk:
    """The disk under ``root`` fills up once ``full`` is set: as on a real one, a file opened there for
    writing cannot grow (its writes raise ENOSPC) while bytes already written may be overwritten, and
    ``torch.save`` to a path fails as torch's C++ writer does on a full disk (a RuntimeError, no errno)."""

    def __init__(self, root: Path, monkeypatch) -> None:
        import builtins
        import io

        import torch

        self.root, self.full = str(root), False
        real_open, real_save = io.open, torch.save

        def opened(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            return _NoGrowth(f) if self._hit(file) and any(c in mode for c in "wax+") else f

        def save(obj, f, *args, **kwargs):
            if self._hit(f):
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 23040 vs 22960")
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(io, "open", opened)
        monkeypatch.setattr(builtins, "open", opened)
        monkeypatch.setattr(torch, "save", save)

    def _hit(self, file) -> bool:
        return self.full and isinstance(file, (str, os.PathLike)) and os.fspath(file).startswith(self.root)


class _NoGrowth:
    def __init__(self, f) -> None:
        self._f = f

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def write(self, data):
        import errno

        n = len(data.encode()) if isinstance(data, str) else memoryview(data).nbytes
        if self._f.tell() + n > os.fstat(self._f.fileno()).st_size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)


def test_a_full_disk_during_training_is_one_line_with_the_free_space_and_the_run_failed(make_cfg, tmp_path,
                                                                                        monkeypatch, capsys):
    """#22.4: the disk fills up once training starts (checkpoints, TensorBoard's events and status.json can no
    longer grow): one `error:` line naming the file and the free space, and status `failed` with that cause
    where mcseg-report reads it."""
    import shutil
    from types import SimpleNamespace

    from mcseg import sweep
    from mcseg.training.trainer import Trainer
    from mcseg.report.collect import read_run
    from mcseg.train import train

    run = tmp_path / "run"
    disk = _FullDisk(run, monkeypatch)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=2**40, used=2**40, free=0))
    real_fit = Trainer.fit

    def fit_on_a_filling_disk(self):
        disk.full = True
        return real_fit(self)

    monkeypatch.setattr(Trainer, "fit", fit_on_a_filling_disk)
    with pytest.raises(SystemExit) as stop:
        sweep.run_job(train, _job_cfg(make_cfg, run), checks_itself=True)
    assert stop.value.code == 1
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert str(run / "checkpoints") in lines[0] and "0 B free" in lines[0], lines
    status = json.loads((run / sweep.STATUS_FILE).read_text())
    assert status["status"] == "failed"
    assert str(run / "checkpoints") in status["error"] and "0 B free" in status["error"]
    record = read_run(run)
    assert record.status == "failed" and record.error == status["error"]
    assert not (run / rundir.LOCK_FILE).exists()


def test_only_the_first_submitit_task_owns_the_run_directory(make_cfg, tmp_path, monkeypatch):
    from mcseg import sweep

    slurm = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "42", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
             "SLURM_LOCALID": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu07"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "unset")  # recorded, so that what submitit's export writes is undone
        monkeypatch.delenv(key)
    run = tmp_path / "run"
    run.mkdir()
    assert sweep.run_job(lambda cfg: "trained", _job_cfg(make_cfg, run)) == "trained"
    assert list(run.iterdir()) == []  # task 1 wrote neither status.json nor a lock


def _fake_run(run: Path, dataset: str, loss: str, seed: int, dice: float, score: float, status: str = "completed"):
    """A run directory as mcseg-report reads it: result.json, status.json, eval/test/{summary.json,per_case.csv}."""
    (run / "eval" / "test").mkdir(parents=True)
    identity = {"configuration": f"loss={loss}", "overrides": [f"loss={loss}"], "loss_name": loss, "loss": {},
                "dataset": dataset, "seed": seed}
    (run / "result.json").write_text(json.dumps({"score": score, "run": identity}))
    (run / "status.json").write_text(json.dumps({"status": status}))
    (run / "eval" / "test" / "summary.json").write_text(json.dumps(
        {"mean_foreground_dice": dice, "mean_foreground_hd95_mm": 1.0, "mean_ece": 0.1, "mean_classwise_ece": 0.1}))
    (run / "eval" / "test" / "per_case.csv").write_text(
        "case,class,dice,hd95_mm,ece,classwise_ece\n" + "".join(f"c{i},1,{dice},1.0,0.1,0.1\n" for i in range(3)))


def test_report_keeps_datasets_apart_finds_duplicate_seeds_and_stale_runs(tmp_path):
    from mcseg.report.collect import collect_runs
    from mcseg.report.table import build_rows
    from mcseg.sweep import collect_job_status

    _fake_run(tmp_path / "a_ce", "acdc", "ce", 0, 0.8, score=0.1)
    _fake_run(tmp_path / "a_margin", "acdc", "margin", 0, 0.9, score=0.9)
    _fake_run(tmp_path / "b_ce", "brats", "ce", 0, 0.5, score=0.5)
    _fake_run(tmp_path / "b_margin_s0", "brats", "margin", 0, 0.4, score=0.2)
    _fake_run(tmp_path / "b_margin_s0_again", "brats", "margin", 0, 0.45, score=0.2)  # the same seed twice
    _fake_run(tmp_path / "killed", "brats", "ce", 1, 0.5, score=0.5, status="running")  # Ctrl-C: no lock left
    _fake_run(tmp_path / "alive", "brats", "ce", 2, 0.5, score=0.5, status="running")
    _hold(tmp_path / "alive", os.getpid())

    runs = collect_runs([tmp_path])
    status = {r.path.name: r.status for r in runs}
    assert status["killed"] == "interrupted" and status["alive"] == "running"
    assert {j["dir"]: j["status"] for j in collect_job_status(tmp_path)}["killed"] == "interrupted"
    rows = build_rows(runs, baseline="ce", n_boot=10)
    by = {(r.dataset, r.loss_name): r for r in rows}
    assert len(rows) == 4  # loss=margin on acdc and on brats are different rows
    assert by["brats", "margin"].seeds == [0]  # not [0, 0] with std 0
    assert [r.path.name for r in runs if r.duplicate_of] == ["b_margin_s0_again"]
    assert {k for k, r in by.items() if r.selected} == set(by)  # one configuration per loss and dataset
    assert by["acdc", "ce"].baseline and by["brats", "ce"].baseline


def test_a_resume_keeps_the_original_record_and_appends_to_the_history(make_cfg, tmp_path):
    from mcseg import sweep

    run = tmp_path / "run"
    first = make_cfg(TINY_2D, output_dir=run)
    assert sweep.run_job(lambda cfg: rundir.begin(resumed=False) or "first", first, checks_itself=True) == "first"
    record = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    assert set(record) == {"config.yaml", "hydra.yaml", "overrides.yaml"}
    again = make_cfg(TINY_2D + ["trainer.resume=true"], output_dir=run)
    assert sweep.run_job(lambda cfg: rundir.begin(resumed=True) or "resumed", again, checks_itself=True) == "resumed"
    assert all((run / ".hydra" / name).read_bytes() == data for name, data in record.items())
    import yaml

    history = yaml.safe_load((run / ".hydra" / rundir.RESUMES_FILE).read_text())
    assert len(history) == 1 and "trainer.resume=true" in history[0]["overrides"]
    assert json.loads((run / "status.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_evaluate_does_not_write_into_a_run_another_process_holds(finished_run, make_cfg, tmp_path):
    from mcseg.evaluate import evaluate

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _hold(finished_run, holder.pid)
        before = snapshot(finished_run)
        cfg = make_cfg([f"ckpt={finished_run}/checkpoints/best.pt", "split=val"], config_name="evaluate",
                       output_dir=tmp_path / "eval_job")
        with pytest.raises(rundir.RunDirBusy, match=f"pid {holder.pid}"):
            evaluate(cfg)
        assert snapshot(finished_run) == before
    finally:
        holder.kill()
        holder.wait()
        (finished_run / rundir.LOCK_FILE).unlink()


def test_tensorboard_events_that_cannot_be_written_stop_its_logging_with_one_warning(tmp_path, monkeypatch, caplog):
    """#22.4: a full disk under TensorBoard's writer is one warning, not its thread's traceback nor the run's end."""
    import errno
    import threading
    from types import SimpleNamespace

    from mcseg.trackers import tb_logger

    class FullWriter:
        def add_scalar(self, *args):
            raise OSError(errno.ENOSPC, "No space left on device")

        close = add_scalar

    seen = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    tb = tb_logger.TensorBoardLogger(tmp_path / "tensorboard")
    tb.writer.close()  # opened as at the first value; then the disk is full
    tb._writer = FullWriter()
    with caplog.at_level("WARNING"):
        tb.scalars({"train/loss": 1.0}, 1)
        tb.scalars({"train/loss": 1.0}, 2)
        tb.close()
    assert [r.getMessage() for r in caplog.records if "TensorBoard logging stopped" in r.getMessage()] == [
        f"cannot write TensorBoard events in {tmp_path / 'tensorboard'} ([Errno 28] No space left on device); "
        "TensorBoard logging stopped"]
    writer_thread = type("_AsyncWriterThread", (threading.Thread,), {"__module__": "tensorboard.summary.writer"})
    threading.excepthook(SimpleNamespace(exc_value=OSError(errno.ENOSPC, "full"), thread=writer_thread()))
    threading.excepthook(SimpleNamespace(exc_value=OSError(errno.ENOSPC, "full"), thread=threading.Thread()))
    assert len(seen) == 1 and not type(seen[0].thread).__module__.startswith("tensorboard")  # only others' threads


def test_a_job_stops_on_ctrl_c_even_when_the_shell_that_launched_it_ignores_sigint(make_cfg, tmp_path):
    """Issue #34 section 3 (smaller): a job started from a shell that ignores SIGINT (a background job of a
    script) inherits SIG_IGN; training installs its own handler and stops, an evaluation ignored Ctrl-C."""
    import signal
    import time

    from mcseg import sweep

    def evaluation(cfg):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(3)  # the signal is delivered here: a KeyboardInterrupt, unless it is ignored
        return "not stopped"

    run = tmp_path / "eval"
    run.mkdir()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(SystemExit) as stopped:
            sweep.run_job(evaluation, _job_cfg(make_cfg, run))
        assert stopped.value.code == 130
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the launcher's choice is back after the job
    finally:
        signal.signal(signal.SIGINT, previous)
    assert json.loads((run / "status.json").read_text())["status"] == "interrupted"


@pytest.mark.slow
def test_a_failed_conformal_pass_leaves_no_evaluation_that_refuses_the_rerun(finished_run, make_cfg, tmp_path,
                                                                           monkeypatch):
    """An evaluation whose conformal pass fails after the split's figures were written leaves no summary.json
    behind: the corrected command is not refused as 'an earlier evaluation' (#55)."""
    import mcseg.evaluation.conformal as conformal
    from mcseg.evaluate import evaluate

    out = tmp_path / "eval"
    overrides = [f"ckpt={finished_run}/checkpoints/best.pt", "split=test", "conformal.enabled=true",
                 "conformal.repeats=0", "posthoc.apply=[]", f"eval_dir={out}"]

    def failing(*args, **kwargs):
        raise RuntimeError("the conformal pass failed")

    with monkeypatch.context() as patch:
        patch.setattr(conformal, "conformal_pass", failing)
        with pytest.raises(RuntimeError, match="conformal pass failed"):
            evaluate(make_cfg(overrides, config_name="evaluate", output_dir=tmp_path / "job1"))
    assert not out.exists()
    summary = evaluate(make_cfg(overrides, config_name="evaluate", output_dir=tmp_path / "job2"))
    assert "conformal" in summary and (out / "summary.json").is_file()

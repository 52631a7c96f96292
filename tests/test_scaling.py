"""Scaling out (docs/scaling.md): device slots on one host (hydra/launcher=slots), Optuna studies in a journal file
or behind Optuna's gRPC proxy, and sweeps submitted without waiting (hydra.launcher.wait=false, mcseg-sweep)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from mcseg import slots as slots_module
from mcseg.slots import SLOT_DIR, Slot, make_slots, take_slot
from mcseg.submitted import main as sweep_main, read_jobs
from mcseg.trials import open_storage
from tests.conftest import ROOT, TINY_2D, run_cli

JOB = TINY_2D + ["logger.images=0", "posthoc.fit=[]", "posthoc.apply=[]"]


def _job_dirs(sweep: Path) -> list[Path]:
    return sorted(p.parent for p in sweep.glob("*/status.json"))


# ---------------------------------------------------------------------------------------------- device slots

def test_slots_are_gpus_times_jobs_per_gpu_or_cpu_shares():
    assert make_slots(None, 1, 2, 3) == [Slot("cpu0", "", 3), Slot("cpu1", "", 3)]
    # ids index the sweep's own CUDA_VISIBLE_DEVICES: GPU 1 of "4,6" is the machine's GPU 6
    assert make_slots([1, 0], 2, None, 1, device_count=2, visible="4,6") == [
        Slot("gpu1.0", "6", 1), Slot("gpu1.1", "6", 1), Slot("gpu0.0", "4", 1), Slot("gpu0.1", "4", 1)]
    assert [s.cuda_visible_devices for s in make_slots([0, 2], 1, None, 1, device_count=3, visible="")] == ["0", "2"]


@pytest.mark.parametrize("gpus, count, message", [
    ([0], 0, r"hydra.launcher.gpus=\[0\]: GPU 0 does not exist: this process sees 0 CUDA device\(s\); no GPU here"),
    ([1, 4], 2, r"GPU 4 does not exist: this process sees 2 CUDA device\(s\); use ids 0..1"),
    ([1, 1], 2, r"hydra.launcher.gpus=\[1, 1\]: a GPU is listed twice"),
])
def test_a_gpu_the_machine_does_not_show_is_refused(gpus, count, message):
    with pytest.raises(ValueError, match=message):
        make_slots(gpus, 1, None, 1, device_count=count, visible="")


def test_a_worker_takes_a_free_slot_and_a_dead_ones_slot_is_freed(tmp_path, monkeypatch):
    """The slot's lock is a flock: held by a live process, freed by the kernel when it dies (kill -9 included)."""
    import torch

    for key in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", slots_module.SLOT_ENV):
        monkeypatch.setenv(key, "x")  # restored after the test: take_slot sets the job's environment
    threads = torch.get_num_threads()
    slots = [Slot("cpu0", "", 1), Slot("cpu1", "", 1)]
    (tmp_path / SLOT_DIR).mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"),
        str(tmp_path / SLOT_DIR / "cpu0.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(slots_module, "_taken", None)
        assert take_slot(slots, tmp_path).name == "cpu1"  # cpu0 is another live worker's
        assert os.environ["MCSEG_SLOT"] == "cpu1" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
        assert take_slot(slots, tmp_path).name == "cpu1"  # a worker keeps its slot for its next jobs
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        monkeypatch.setattr(slots_module, "_taken", None)  # a second worker
        assert take_slot(slots, tmp_path).name == "cpu0"  # freed by the killed holder's death
    finally:
        holder.kill()
        torch.set_num_threads(threads)
        taken = slots_module._taken
        if taken is not None:
            os.close(taken[1])


@pytest.mark.slow  # 4 tiny trainings in 2 worker processes: about 1 to 3 min on 2 busy cores
def test_four_jobs_over_two_slots_never_share_one(tmp_path):
    """Two jobs fail at their config check (negative margin): their slots go on to the next jobs, and they are
    summarised as failed like any failed job."""
    sweep = tmp_path / "slots"
    proc = run_cli("train.py", ["-m", "hydra/launcher=slots", "hydra.launcher.cpu_slots=2", "loss=margin",
                                "loss.margin=-1,2", "seed=0,1", f"hydra.sweep.dir={sweep}", *JOB], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in (sweep / "slots.jsonl").read_text().splitlines()]
    assert sorted(r["job"] for r in runs) == [0, 1, 2, 3]
    assert {r["slot"] for r in runs} == {"cpu0", "cpu1"} and all(r["threads"] == 1 for r in runs)
    for slot in ("cpu0", "cpu1"):  # one job at a time in each slot, always in the same worker process
        spans = sorted((r["start"], r["end"]) for r in runs if r["slot"] == slot)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
        assert len({r["pid"] for r in runs if r["slot"] == slot}) == 1
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["counts"] == {"completed": 2, "failed": 2}
    by_job = {r["job"]: r for r in runs}
    for job in summary["jobs"]:
        status = json.loads((sweep / job["dir"] / "status.json").read_text())
        assert status["slot"]["name"] == by_job[status["job_num"]]["slot"]
        if job["status"] == "completed":
            result = json.loads((sweep / job["dir"] / "result.json").read_text())
            assert result["slot"] == status["slot"] and result["slot"]["cuda_visible_devices"] == ""


@pytest.mark.slow  # one start of train.py (a few seconds idle, longer on busy cores)
def test_a_missing_gpu_is_refused_before_any_job_starts(tmp_path):
    sweep = tmp_path / "gpus"
    proc = run_cli("train.py", ["-m", "hydra/launcher=slots", "hydra.launcher.gpus=[0,7]", "seed=0,1",
                                f"hydra.sweep.dir={sweep}", *JOB])
    assert proc.returncode == 1 and "error: hydra.launcher.gpus=[0, 7]: GPU 0 does not exist" in proc.stderr, \
        proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert _job_dirs(sweep) == [] and not (sweep / "slots.jsonl").exists()
    assert not (sweep / "sweep_summary.json").exists()  # nothing ran: no summary telling how to continue it


# ------------------------------------------------------------------------ Optuna storage without a database

def test_a_journal_file_holds_a_study_that_several_storages_share(tmp_path):
    url = f"journal:{tmp_path / 'study.log'}"
    first = optuna.create_study(storage=open_storage(url), study_name="s", direction="maximize")
    trial = first.ask()
    trial.suggest_float("x", 0, 1)
    other = optuna.load_study(storage=open_storage(url), study_name="s")  # another process's view
    other.tell(trial.number, 0.5)
    assert [t.state for t in first.trials] == [TrialState.COMPLETE] and first.best_value == 0.5
    absolute = open_storage(f"journal://{tmp_path / 'study.log'}")  # journal:///abs/path
    assert optuna.load_study(storage=absolute, study_name="s").best_value == 0.5


@pytest.mark.parametrize("url, message", [
    ("redis://host/0", r"hydra.sweeper.storage='redis://host/0' is not a storage Optuna can open .*journal:PATH"),
    ("optuna.db", r"is not a storage Optuna can open"),
    ("grpc://host", r"expected grpc://HOST:PORT"),
    ("journal:", r"expected journal:PATH"),
    ("journal:/no/such/folder/study.log", r"the journal's folder /no/such/folder does not exist"),
])
def test_a_storage_optuna_cannot_open_is_named(url, message):
    with pytest.raises(ValueError, match=message):
        open_storage(url)


def test_a_journal_in_a_read_only_folder_is_refused(tmp_path, monkeypatch):
    """As the user sees it (os.access): tests may run as root, whom the OS lets write a read-only folder."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **kw: False if Path(path) == folder and mode & os.W_OK
                        else real(path, mode, *a, **kw))
    with pytest.raises(ValueError, match=rf"{folder} is not writable \(the journal and its lock file"):
        open_storage(f"journal:{folder / 'study.log'}")
    assert list(folder.iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_the_grpc_proxy_serves_a_journal_study(tmp_path):
    journal, port = tmp_path / "study.log", _free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "mcseg.optuna_proxy", f"journal:{journal}", "--port", str(port)],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout.readline().startswith("serving")
        import socket
        import time

        deadline = time.monotonic() + 60  # "serving" is printed before the server binds: wait for the port
        while True:
            try:
                socket.create_connection(("localhost", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"the proxy never listened on port {port}"
                time.sleep(0.2)
        study = optuna.create_study(storage=open_storage(f"grpc://localhost:{port}"), study_name="s")
        study.tell(study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 2.0)
        direct = optuna.load_study(storage=open_storage(f"journal:{journal}"), study_name="s")
        assert [t.value for t in direct.trials] == [2.0]
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)


@pytest.mark.slow  # one start of train.py
def test_an_unknown_storage_is_refused_before_any_job_starts(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli("train.py", ["hparams_search=margin_optuna", "hydra.sweeper.storage=mongodb://host/db",
                                f"hydra.sweep.dir={sweep}", *JOB])
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "error: config key 'hydra.sweeper.storage'=mongodb://host/db: SQLAlchemy knows no database" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _job_dirs(sweep) == [] and not (sweep / "sweep_summary.json").exists()


@pytest.mark.slow  # three sweep processes of tiny trainings: 2 to 4 min on 2 busy cores
def test_three_processes_share_a_journal_study_one_killed(tmp_path):
    """kill -9 of one sweeper while its trial runs: the others tell that trial failed (its process is gone) and
    the study ends with exactly n_trials trials, numbered once each."""
    url = f"journal:{tmp_path / 'study.log'}"
    args = ["hparams_search=margin_optuna", f"hydra.sweeper.storage={url}", "hydra.sweeper.n_trials=5",
            "trainer.max_epochs=1", *JOB]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"hydra.sweep.dir={tmp_path / n}"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for n in ("a", "b", "c")]
    victim = procs[2]
    deadline = time.time() + 600
    while time.time() < deadline:  # its first trial asked: kill it mid-trial
        try:
            study = optuna.load_study(study_name="margin", storage=open_storage(url))
            if any(t.user_attrs.get("sweeper", {}).get("pid") == victim.pid for t in study.trials):
                break
        except KeyError:  # the study is not created yet
            pass
        time.sleep(0.5)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for proc in procs[:2]:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    study = optuna.load_study(study_name="margin", storage=open_storage(url))
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    killed = [t for t in study.trials if t.user_attrs["sweeper"]["pid"] == victim.pid]
    assert [t.state for t in killed] == [TrialState.FAIL]
    assert all(t.state == TrialState.COMPLETE for t in study.trials if t not in killed)


# ------------------------------------------------------------------------------------- submit and go

def test_a_resubmitted_job_is_listed_once_by_its_latest_submission(tmp_path, capsys):
    lines = [{"num": 0, "job_id": "11", "dir": "0_a"}, {"num": 1, "job_id": "12", "dir": "1_b"},
             {"num": 0, "job_id": "21", "dir": "0_a"}]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [j["job_id"] for j in read_jobs(tmp_path)] == ["21", "12"]
    assert sweep_main(["status", str(tmp_path / "nothing")]) == 1
    assert "is not a sweep submitted with hydra.launcher.wait=false" in capsys.readouterr().err


def _submit(sweep: Path, *extra: str) -> None:
    """The detached sweep of two tiny trainings; returns when the submitting process has."""
    log = sweep.parent / f"submit{len(list(sweep.parent.glob('submit*.txt')))}.txt"
    with open(log, "w") as out:  # not a pipe: the jobs outlive the sweep process and would keep it open
        done = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=submitit_debug",
                               "hydra.launcher.wait=false", "seed=0,1", f"hydra.sweep.dir={sweep}", *JOB, *extra],
                              cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=out,
                              timeout=600)
    assert done.returncode == 0, log.read_text()[-3000:]


def _status_until_done(sweep: Path, capsys) -> list[dict]:
    deadline, jobs = time.time() + 900, None
    while jobs is None or (time.time() < deadline and any(j["scheduler"] == "RUNNING" for j in jobs)):
        if jobs is not None:
            time.sleep(2)
        assert sweep_main(["status", str(sweep), "--json"]) == 0
        jobs = json.loads(capsys.readouterr().out)
    return jobs


@pytest.mark.slow  # four tiny job processes through submitit's local executor: 2 to 5 min on 2 busy cores
def test_a_detached_sweep_returns_at_once_and_status_follows_its_jobs(tmp_path, capsys):
    """Submitted again with trainer.auto_resume=true, its completed jobs end at once, their runs untouched."""
    sweep = tmp_path / "detached"
    _submit(sweep)
    assert sweep_main(["status", str(sweep), "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)
    assert [j["num"] for j in jobs] == [0, 1]
    assert any(j["scheduler"] == "RUNNING" for j in jobs)  # returned before its jobs ended
    jobs = _status_until_done(sweep, capsys)
    assert [(j["scheduler"], j["run"]) for j in jobs] == [("FINISHED", "completed")] * 2
    results = {j["dir"]: (sweep / j["dir"] / "result.json").stat().st_mtime_ns for j in jobs}
    assert sweep_main(["status", str(sweep)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 completed"

    _submit(sweep, "trainer.auto_resume=true")
    again = _status_until_done(sweep, capsys)
    assert len((sweep / "jobs.jsonl").read_text().splitlines()) == 4  # each job listed by its latest submission
    assert [j["job_id"] for j in again] != [j["job_id"] for j in jobs]
    assert [(j["scheduler"], j["run"]) for j in again] == [("FINISHED", "completed")] * 2
    assert {d: (sweep / d / "result.json").stat().st_mtime_ns for d in results} == results


def test_the_optuna_sweeper_refuses_submit_and_go(capsys, monkeypatch):
    """It needs each trial's value before it asks the next: refused at set-up, in one line."""
    from omegaconf import OmegaConf

    from mcseg import sweep

    monkeypatch.setattr(sweep, "_stop_reason", None)  # restored after the test: the refusal sets it
    monkeypatch.delenv("MCSEG_TRACEBACK", raising=False)

    from hydra_plugins.mcseg_submit_launcher.submit_launcher import DetachableLocalLauncher

    config = OmegaConf.create({"hydra": {"sweeper": {
        "_target_": "hydra_plugins.mcseg_optuna_sweeper.optuna_sweeper.OptunaSweeper"}}})
    launcher = DetachableLocalLauncher(wait=False, submitit_folder="unused")
    with pytest.raises(SystemExit) as stop:
        launcher.setup(hydra_context=None, task_function=None, config=config)
    assert stop.value.code == 1
    assert "error: hydra.launcher.wait=false: the Optuna sweeper" in capsys.readouterr().err
    DetachableLocalLauncher(wait=True, submitit_folder="unused").setup(  # waiting, it is Hydra's launcher
        hydra_context=None, task_function=None, config=config)

"""mcseg on a CPU shared with other processes (docs/benchmarks.md, "Under load")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mcseg import runtime
from mcseg.runtime import AdaptiveThreads, runqueue_waits
from tests.conftest import torch_threads

ROOT = Path(__file__).resolve().parent.parent


class FakeScheduler:
    """A clock and the run-queue waits of two threads that the test advances by hand."""

    def __init__(self) -> None:
        self.now, self.waited = 0.0, {1: 0, 2: 0}

    def advance(self, seconds: float, waiting_share: float) -> None:
        """``seconds`` of wall time in which each thread waited ``waiting_share`` of it for a core."""
        self.now += seconds
        for tid in self.waited:
            self.waited[tid] += int(seconds * waiting_share * 1e9)


@pytest.fixture
def two_threads():
    with torch_threads(2):
        yield


def governor(fake: FakeScheduler, **kw) -> AdaptiveThreads:
    return AdaptiveThreads("cpu", clock=lambda: fake.now, waits=lambda: dict(fake.waited), **kw)


def test_a_quiet_machine_keeps_every_thread(two_threads):
    fake = FakeScheduler()
    threads = governor(fake)
    for _ in range(20):
        fake.advance(0.5, waiting_share=0.02)
        threads.tick()
    assert torch.get_num_threads() == 2 and threads.reductions == 0


def test_a_busy_machine_drops_to_one_thread_and_probes_again_with_growing_back_off(two_threads):
    fake = FakeScheduler()
    threads = governor(fake, interval_s=1.0, backoff_s=10.0, max_backoff_s=40.0)
    fake.advance(1.0, waiting_share=0.5)  # two threads, each waiting half the time: another process has the cores
    threads.tick()
    assert torch.get_num_threads() == 1 and threads.reductions == 1
    fake.advance(9.0, waiting_share=0.0)
    threads.tick()
    assert torch.get_num_threads() == 1  # still backing off
    fake.advance(1.0, waiting_share=0.0)
    threads.tick()
    assert torch.get_num_threads() == 2  # the probe
    fake.advance(1.0, waiting_share=0.5)
    threads.tick()
    assert torch.get_num_threads() == 1 and threads.reductions == 2 and threads.reduced_until == fake.now + 20.0
    fake.advance(20.0, waiting_share=0.0)
    threads.tick()  # the competitor has gone: the probe finds the cores free and keeps them
    fake.advance(1.0, waiting_share=0.0)
    threads.tick()
    assert torch.get_num_threads() == 2 and threads.reductions == 2 and threads.backoff_s == 10.0
    threads.restore()
    assert torch.get_num_threads() == 2


def test_no_probe_while_even_one_thread_waits_for_a_core(two_threads):
    fake = FakeScheduler()
    threads = governor(fake, interval_s=1.0, backoff_s=10.0)
    fake.advance(1.0, waiting_share=0.5)
    threads.tick()
    for _ in range(30):  # the competitor keeps the cores: one thread still waits a third of the time
        fake.advance(1.0, waiting_share=0.33)
        threads.tick()
        assert torch.get_num_threads() == 1
    for _ in range(11):  # it has gone: the probe follows within the back-off
        fake.advance(1.0, waiting_share=0.0)
        threads.tick()
    assert torch.get_num_threads() == 2 and threads.reductions == 1


def test_time_asleep_or_in_serial_code_is_not_contention(two_threads):
    # a thread that sleeps, or waits for the GIL or I/O, is not in the run queue: no waits, all threads kept
    fake = FakeScheduler()
    threads = governor(fake)
    fake.advance(5.0, waiting_share=0.0)
    threads.tick()
    assert torch.get_num_threads() == 2


def test_one_thread_a_gpu_or_the_switch_leave_threads_alone(two_threads, monkeypatch):
    fake = FakeScheduler()
    assert not AdaptiveThreads("cuda", clock=lambda: fake.now, waits=lambda: dict(fake.waited)).enabled
    monkeypatch.setenv("MCSEG_ADAPTIVE_THREADS", "0")
    assert not governor(fake).enabled
    monkeypatch.delenv("MCSEG_ADAPTIVE_THREADS")
    assert not AdaptiveThreads("cpu", waits=lambda: None).enabled  # no scheduler statistics (not Linux)
    torch.set_num_threads(1)
    assert not governor(fake).enabled


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux scheduler statistics only")
def test_run_queue_waits_are_read_for_every_thread_of_the_process():
    waits = runqueue_waits()
    assert waits is not None and os.getpid() in waits and all(v >= 0 for v in waits.values())


def test_training_steps_and_evaluated_cases_report_to_the_process_governor(make_cfg, monkeypatch):
    from mcseg.train import train
    from tests.conftest import TINY_2D

    calls = []
    monkeypatch.setattr(runtime, "_PROCESS_THREADS", None)
    monkeypatch.setattr(runtime.AdaptiveThreads, "tick", lambda self: calls.append(1))
    runtime.share_cpu("cuda")  # a GPU process is not governed
    assert calls == []
    cfg = make_cfg(TINY_2D + ["posthoc.fit=[]", "posthoc.apply=[]"])
    train(cfg)
    split = json.loads((Path(cfg.paths.output_dir) / "split.json").read_text())
    steps = cfg.trainer.max_epochs * cfg.dataset.sampling.samples_per_epoch // cfg.dataset.sampling.batch_size
    validated = cfg.trainer.max_epochs * min(cfg.trainer.val_max_cases, len(split["val"]))
    assert len(calls) == steps + validated + len(split["test"])  # every step, validation case and test case


def test_the_run_records_its_threads():
    from mcseg.runtime import describe_device

    info = describe_device(torch.device("cpu"), "32", False, False)
    assert info["cpu_threads"] == torch.get_num_threads()


@pytest.mark.slow  # a benchmark tool: three torch processes
def test_competitors_run_with_torch_defaults_and_report_their_rates(monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    from competitor import competitors

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the benchmark's own setting must not reach them
    with competitors(1, alone_seconds=1.0) as competition:
        time.sleep(1.0)
    defaults = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    expected = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=defaults,
                              capture_output=True, text=True, check=True).stdout
    assert competition.threads == int(expected)
    assert competition.alone_per_s > 0 and len(competition.beside_per_s) == 1 and competition.beside_per_s[0] > 0
    assert "1 competing torch process" in competition.describe()


def test_loader_workers_follow_the_configured_threads_not_a_momentary_reduction(two_threads, monkeypatch):
    from mcseg.training import loader as data

    fake = FakeScheduler()
    threads = governor(fake)
    monkeypatch.setattr(runtime, "_PROCESS_THREADS", threads)
    monkeypatch.setattr(data, "available_cpus", lambda: 2)
    fake.advance(1.0, waiting_share=0.5)
    threads.tick()
    assert torch.get_num_threads() == 1
    # a run built now (the next job of a sequential sweep) must not add a worker that the probe would oversubscribe
    assert data.default_workers(torch.device("cpu")) == 0

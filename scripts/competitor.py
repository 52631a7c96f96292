"""Competing CPU load for the benchmarks (``--competitor N``): N plain torch processes with torch's
default threads and OpenMP settings, busy with 3D convolutions for as long as a measurement runs.

This is the load of a shared workstation or GPU node: another user's training. Each competitor
reports its own rate (convolutions per second), alone before the measurement and beside mcseg
during it, so a table can show that mcseg's speed under load is not bought with the competitor's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

# What the competitors must not inherit from the benchmark's own environment: they run as a plain torch
# program would, with its default threads and wait policy.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")

_CHILD = r"""
import signal, sys, time
import torch
import torch.nn.functional as F

stop = False
def _stop(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, _stop)
x, w = torch.randn(2, 16, 32, 48, 48), torch.randn(16, 16, 3, 3, 3)
F.conv3d(x, w, padding=1)
print(torch.get_num_threads(), flush=True)
n, start = 0, time.perf_counter()
while not stop:
    F.conv3d(x, w, padding=1)
    n += 1
print(n / (time.perf_counter() - start), flush=True)
"""


@dataclass
class Competition:
    """What the competitors did: their threads, their rate alone, and their rates beside the measurement."""

    n: int
    threads: int = 0
    alone_per_s: float = 0.0
    beside_per_s: list[float] = field(default_factory=list)

    def describe(self) -> str:
        if not self.n:
            return "no competitor"
        beside = sum(self.beside_per_s) / max(len(self.beside_per_s), 1)
        return (f"{self.n} competing torch process(es) with {self.threads} threads each (3D convolutions): "
                f"{self.alone_per_s:.1f} conv/s alone, {beside:.1f} conv/s each beside mcseg "
                f"({self.alone_per_s / beside if beside else float('nan'):.1f}x slower)")


def _start(n: int) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    return procs


def _stop(procs: list[subprocess.Popen]) -> list[float]:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    rates = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        rates.append(float(out.strip().splitlines()[-1]))
    return rates


def alone_rate(seconds: float = 8.0) -> tuple[int, float]:
    """(threads, conv/s) of one competitor running alone for ``seconds``."""
    (proc,) = _start(1)
    threads = int(proc.stdout.readline())
    time.sleep(seconds)
    return threads, _stop([proc])[0]


@contextmanager
def competitors(n: int, alone_seconds: float = 8.0):
    """Run ``n`` competitors (after measuring one alone for ``alone_seconds``) for the duration of the
    ``with`` block; yields the :class:`Competition`, whose ``beside_per_s`` is filled when the block ends."""
    competition = Competition(n)
    if n <= 0:
        yield competition
        return
    competition.threads, competition.alone_per_s = alone_rate(alone_seconds)
    procs = _start(n)
    try:
        for p in procs:  # each has started its loop
            p.stdout.readline()
        yield competition
    finally:
        competition.beside_per_s = _stop(procs)

"""keep_freed_memory (mcseg.runtime): glibc keeps the memory of freed large tensors, so that a training step's
activations are not faulted in and zeroed again every step; ``MCSEG_KEEP_FREED_MEMORY=0`` leaves malloc alone."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from .conftest import ROOT

# A tensor above glibc's largest default mmap threshold (32 MiB), allocated, written and freed 20 times;
# prints the minor page faults per round and what keep_freed_memory did.
PROBE = """
import json, resource, sys, torch
from mcseg.runtime import keep_freed_memory
done = keep_freed_memory() if sys.argv[1] == "keep" else "not called"
def rounds(n):
    for _ in range(n):
        torch.empty(48 << 20, dtype=torch.uint8).fill_(1)
rounds(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(20)
print(json.dumps({"faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20, "done": done}))
"""


def _probe(mode: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_large_tensors_are_reused_not_faulted_in_again():
    pages = (48 << 20) // os.sysconf("SC_PAGE_SIZE")
    plain, kept = _probe("plain"), _probe("keep")
    assert plain["faults"] > 0.5 * pages  # glibc as configured: every round maps fresh pages
    # kept: most rounds reuse the freed pages (torch 2.13 still faults a few rounds in: 0.3 of plain measured)
    assert kept["faults"] < 0.5 * plain["faults"] and kept["done"].startswith("glibc mallopt")
    off = _probe("keep", MCSEG_KEEP_FREED_MEMORY="0")
    assert off["done"].startswith("off") and off["faults"] > 0.5 * pages


def test_an_evaluator_keeps_freed_memory(monkeypatch):
    """An Evaluator used from Python (a script, scripts/bench_metrics.py) keeps freed memory as the commands do: a
    small case's temporaries were faulted in afresh each case (issue #58). Checked through the switch that leaves
    malloc alone, so this process's allocator is not changed."""
    import mcseg.runtime as runtime
    from mcseg.config import EvalProtocol
    from mcseg.evaluation.evaluator import Evaluator

    monkeypatch.setattr(runtime, "_kept_memory", None)
    monkeypatch.setenv("MCSEG_KEEP_FREED_MEMORY", "0")
    Evaluator(2, ["background", "organ"], EvalProtocol())
    assert runtime._kept_memory == "off (MCSEG_KEEP_FREED_MEMORY=0)"

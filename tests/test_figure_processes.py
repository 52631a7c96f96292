"""An evaluation's figures drawn by child processes: the same files to the byte as drawn in the process itself,
a failure named with its file, and nothing half-written when the evaluation stops early."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import mcseg.evaluation.figure_processes as figure_processes
from mcseg.config import EvalProtocol
from mcseg.evaluation.evaluator import Evaluator
from mcseg.evaluation.figure_processes import FigureError, FigureProcesses

from .metrics.test_evaluator import NAMES, _case

pytestmark = pytest.mark.skipif(not figure_processes._parallel(), reason="needs fork and more than one CPU")


def _write(out: Path) -> dict[str, bytes]:
    ev = Evaluator(4, NAMES, EvalProtocol(bootstrap_samples=50))
    for s in range(2):
        ev.add_case(f"case_{s}", *_case(s, shape=(14, 12, 8)), (1.0, 1.2, 2.0))
    ev.write(out)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_figures_drawn_by_children_are_the_bytes_drawn_in_the_process(tmp_path, monkeypatch):
    parallel = _write(tmp_path / "parallel" / "eval")  # the folder name is in the titles
    monkeypatch.setattr(figure_processes, "_parallel", lambda: False)
    here = _write(tmp_path / "here" / "eval")
    assert {"reliability.png", "reliability_histogram.png"} <= set(parallel)
    assert parallel.keys() == here.keys()
    for name in parallel:
        assert parallel[name] == here[name], name


class _Broken:
    def savefig(self, path, **kwargs):
        Path(path).write_bytes(b"half")
        raise ValueError("no ink left")


class _Slow:
    def savefig(self, path, **kwargs):
        Path(path).write_bytes(b"half")
        time.sleep(30)


def test_a_failed_figure_is_named_and_leaves_no_file(tmp_path):
    with pytest.raises(FigureError, match=r"broken\.png: ValueError: no ink left"):
        with FigureProcesses() as drawing:
            drawing.start(tmp_path / "broken.png", _Broken)
            drawing.wait()
    assert list(tmp_path.iterdir()) == []


def test_leaving_early_stops_the_children_and_removes_their_partial_files(tmp_path):
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        with FigureProcesses() as drawing:
            drawing.start(tmp_path / "slow.png", _Slow)
            deadline = time.time() + 20
            while not any(tmp_path.iterdir()) and time.time() < deadline:  # the child is inside its write
                time.sleep(0.05)
            raise KeyboardInterrupt
    assert time.perf_counter() - start < 20
    assert list(tmp_path.iterdir()) == []


def test_no_fork_once_cuda_is_initialised(monkeypatch):
    """A forked child cannot use its parent's CUDA context, and a GPU evaluation holds its sums there."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not figure_processes._parallel()

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


def _same_as_drawn_here(files: dict[str, bytes], tmp_path: Path, monkeypatch) -> None:
    """``files`` are every file, PNGs included, that the evaluation writes drawing its figures in its process."""
    monkeypatch.setattr(figure_processes, "_parallel", lambda: False)
    here = _write(tmp_path / "here" / "eval")  # the folder name is in the titles: the same last part
    assert {"reliability.png", "reliability_histogram.png"} <= set(files)
    assert files.keys() == here.keys()
    for name in files:
        assert files[name] == here[name], name


def test_figures_drawn_by_children_are_the_bytes_drawn_in_the_process(tmp_path, monkeypatch):
    _same_as_drawn_here(_write(tmp_path / "parallel" / "eval"), tmp_path, monkeypatch)


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


def _preloaded_write(out: Path) -> dict[str, bytes]:
    figure_processes.preload()  # as a folder command does when its cases start
    assert figure_processes._DRAWER is not None
    return _write(out)


def test_figures_sent_to_the_preloaded_drawer_are_the_bytes_drawn_in_the_process(tmp_path, monkeypatch):
    """The drawer forked by preload() (matplotlib imported there, beside the cases) draws each figure in a child
    of its own from the numbers it is sent: the same PNGs as drawn in the evaluation's process."""
    drawn = _preloaded_write(tmp_path / "drawer" / "eval")
    assert figure_processes._DRAWER is None  # taken by the evaluation, ended by its wait()
    _same_as_drawn_here(drawn, tmp_path, monkeypatch)


def _broken_figure(message: str):
    return _Broken()


def _slow_figure():
    return _Slow()


def _gone(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_figure_failed_in_the_drawer_is_named_and_leaves_no_file(tmp_path):
    figure_processes.preload()
    with pytest.raises(FigureError, match=r"broken\.png: ValueError: no ink left"):
        with FigureProcesses() as drawing:
            drawing.start(tmp_path / "broken.png", _broken_figure, "no ink")
            drawing.wait()
    assert list(tmp_path.iterdir()) == []


def test_leaving_early_stops_the_drawer_and_its_children_and_removes_their_partial_files(tmp_path):
    figure_processes.preload()
    drawer = figure_processes._DRAWER.pid
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        with FigureProcesses() as drawing:
            drawing.start(tmp_path / "slow.png", _slow_figure)
            deadline = time.time() + 20
            while not any(tmp_path.iterdir()) and time.time() < deadline:  # the drawer's child is inside its write
                time.sleep(0.05)
            raise KeyboardInterrupt
    assert time.perf_counter() - start < 20
    assert list(tmp_path.iterdir()) == []
    assert _gone(drawer)


def test_a_drawer_no_evaluation_took_is_released():
    """An evaluation that fails before its figures releases the drawer it preloaded (folders._evaluate)."""
    figure_processes.preload()
    pid = figure_processes._DRAWER.pid
    figure_processes.release()
    assert figure_processes._DRAWER is None
    assert _gone(pid)


def test_a_folder_evaluation_leaves_matplotlib_to_its_figures_processes(tmp_path):
    """The evaluation's own process never imports matplotlib (1 CPU s): the drawer does, beside the cases, and
    each figure is drawn by a child of it (#58). Before, a thread of the evaluation's process imported it, taking
    the GIL from the cases."""
    import subprocess
    import sys
    import textwrap

    from tests.test_monai_folders import _labels
    from tests.tool_outputs import make_monai

    labels = _labels(tmp_path / "labels", (11, 9, 6), n=3)
    pred = make_monai(tmp_path / "pred", labels, noise=3.0)  # (MONAI imports matplotlib: here, not below)
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from mcseg.config import EvalProtocol
        from mcseg.evaluate_folder import evaluate_folder
        out = Path({str(tmp_path / "out")!r})
        evaluate_folder(Path({str(pred)!r}), Path({str(labels)!r}), protocol=EvalProtocol(bootstrap_samples=5),
                        output_dir=out, workers=1)
        assert (out / "reliability.png").stat().st_size > 0
        print(sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib")[:3])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_folder_evaluation_that_fails_releases_its_drawer(tmp_path, monkeypatch):
    """The drawer forked as the cases start is stopped when the evaluation ends before its figures."""
    import mcseg.evaluation.folders as folders
    from mcseg.config import EvalProtocol
    from mcseg.evaluate_folder import evaluate_folder
    from tests.test_monai_folders import _labels
    from tests.tool_outputs import make_monai

    labels = _labels(tmp_path / "labels", (11, 9, 6), n=2)
    pred = make_monai(tmp_path / "pred", labels, noise=3.0)
    drawers = []
    monkeypatch.setattr(folders, "preload", lambda: (figure_processes.preload(),
                                                     drawers.append(figure_processes._DRAWER.pid)))

    def broken(*args):
        raise ValueError("a case that cannot be scored")
    monkeypatch.setattr(folders, "score_case", broken)
    with pytest.raises(ValueError, match="cannot be scored"):
        evaluate_folder(pred, labels, protocol=EvalProtocol(bootstrap_samples=5), output_dir=tmp_path / "out")
    assert len(drawers) == 1 and figure_processes._DRAWER is None
    assert _gone(drawers[0])

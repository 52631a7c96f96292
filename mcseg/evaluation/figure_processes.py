"""An evaluation's PNG figures drawn in child processes while the evaluation writes its tables.

matplotlib draws on one core and its layout and rasterising take most of the time an evaluation of small cases
spends after its cases (docs/benchmarks.md, issue #58): the reliability diagram and the dataset reliability
histogram took about as long together as scoring the 31 hippocampus test cases. Each figure is drawn by a forked
child from the parent's memory (the pooled sums, nothing pickled), so the figures are drawn side by side with each
other and with the parent's summary, smooth ECE and tables; the PNG files are the same bytes as drawn in the
parent (the same matplotlib calls on the same numbers; ``tests/test_figure_processes.py``).

Where ``fork`` is not available, one CPU is all the process has, or CUDA is initialised, the figures are drawn
in the process itself when :meth:`FigureProcesses.wait` is called. Each file is written atomically
(``mcseg.files.atomic_write``): a figure is whole or absent. A child that fails makes
:meth:`~FigureProcesses.wait` raise :class:`FigureError`
naming the file and the child's error; leaving the ``with`` block early (an error, Ctrl-C) stops the children.
"""
from __future__ import annotations

import os
import signal
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mcseg.files import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FigureError", "FigureProcesses", "preload", "save_png"]


class FigureError(RuntimeError):
    """A figure that its process could not draw or write."""


def save_png(path: Path, fig: Figure) -> None:
    """``fig`` as a PNG at 100 dpi, written atomically: the evaluation's figure files."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


def _parallel() -> bool:
    """Whether to fork: not with one CPU, nor once CUDA is initialised (an evaluation on a GPU holds its sums
    there, and a forked child cannot use its parent's CUDA context)."""
    import torch

    from mcseg.runtime import available_cpus

    return hasattr(os, "fork") and available_cpus() > 1 and not torch.cuda.is_initialized()


_PRELOAD: threading.Thread | None = None


def preload() -> None:
    """Import matplotlib's figure modules in a background thread (once), so that the children forked to draw
    inherit them instead of each importing them (1.3 CPU s apiece here): call it where this process has a core
    to spare, e.g. once the case workers run. :meth:`FigureProcesses.start` waits for it before it forks (a fork
    during an import could leave the child an import lock that no thread of it will release)."""
    global _PRELOAD
    if _PRELOAD is None:
        _PRELOAD = threading.Thread(target=_import_matplotlib, name="mcseg figure imports", daemon=True)
        _PRELOAD.start()


def _import_matplotlib() -> None:
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.colors  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import matplotlib.ticker  # noqa: F401


def _leave(signum, frame) -> None:
    raise SystemExit(1)


class FigureProcesses:
    """``with FigureProcesses() as figures: figures.start(path, make); ...; figures.wait()``: ``make()`` returns
    the Figure saved at ``path`` (module docstring)."""

    def __init__(self) -> None:
        self._children: list[tuple[Path, int, int]] = []  # path, pid, read end of its error pipe
        self._here: list[tuple[Path, Callable[[], Figure]]] = []

    def start(self, path: Path, make: Callable[[], Figure]) -> None:
        if not _parallel():
            self._here.append((Path(path), make))
            return
        if _PRELOAD is not None:
            _PRELOAD.join()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: draw, write, leave without the parent's exit handlers or buffered output
            code = 1
            try:
                os.close(read)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's, which stops the children
                signal.signal(signal.SIGTERM, _leave)  # stopped: atomic_write removes its temporary file
                import torch

                torch.set_num_threads(1)  # no OpenMP pool of the parent's in a forked child
                save_png(Path(path), make())
                code = 0
            except BaseException:  # noqa: BLE001 - every failure goes back to the parent as text
                os.write(write, traceback.format_exc().encode(errors="replace")[-4000:])
            finally:
                os._exit(code)
        os.close(write)
        self._children.append((Path(path), pid, read))

    def wait(self) -> None:
        """Draw the figures kept for this process, then wait for the children; :class:`FigureError` if any
        failed."""
        for path, make in self._here:
            save_png(path, make())
        self._here = []
        errors = []
        while self._children:
            path, pid, read = self._children.pop(0)
            with os.fdopen(read, "rb") as pipe:
                text = pipe.read().decode(errors="replace").strip()
            _, status = os.waitpid(pid, 0)
            if status != 0:
                errors.append(f"{path}: {text.splitlines()[-1] if text else f'drawing process ended ({status})'}")
        if errors:
            raise FigureError("figure not written: " + "; ".join(errors))

    def __enter__(self) -> FigureProcesses:
        return self

    def __exit__(self, *exc) -> None:
        for _, pid, read in self._children:  # left early: stop what still draws
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(read)
        self._children = []

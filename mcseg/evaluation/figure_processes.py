"""An evaluation's PNG figures drawn in child processes while the evaluation writes its tables.

matplotlib draws on one core and its layout and rasterising take most of the time an evaluation of small cases
spends after its cases (docs/benchmarks.md, issue #58): the reliability diagram and the dataset reliability
histogram took about as long together as scoring the 31 hippocampus test cases. Each figure is drawn by a forked
child, so the figures are drawn side by side with each other and with the parent's summary, smooth ECE and tables;
the PNG files are the same bytes as drawn in the parent (the same matplotlib calls on the same numbers;
``tests/test_figure_processes.py``).

Importing matplotlib costs a process about 1 CPU s here. A folder command calls :func:`preload` when its cases
start: it forks the *drawer*, a process that imports matplotlib on a spare core while the cases are scored and
then waits; the figures' children are forked from it (they inherit the import), the figures' numbers sent to it
pickled. Without a drawer (a training's evaluation) each child is forked from the evaluation's process at the end
and draws from the parent's memory (``make`` may then be any callable).

Where ``fork`` is not available, one CPU is all the process has, or CUDA is initialised, the figures are drawn
in the process itself when :meth:`FigureProcesses.wait` is called. Each file is written atomically
(``mcseg.files.atomic_write``): a figure is whole or absent. A child that fails makes
:meth:`~FigureProcesses.wait` raise :class:`FigureError` naming the file and the child's error; leaving the
``with`` block early (an error, Ctrl-C) stops the children (and the drawer with its children).
"""
from __future__ import annotations

import os
import pickle
import signal
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mcseg.files import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FigureError", "FigureProcesses", "preload", "release", "save_png"]


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


def _import_matplotlib() -> None:
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.colors  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import matplotlib.ticker  # noqa: F401


def _warm_up() -> None:
    """Draw, unsaved, a small figure with a log axis: matplotlib's fonts and its parsed tick labels 10^0 ... 10^9
    (the voxel counts' axes of both figures; 0.4 s of a reliability diagram here) are then loaded and cached in
    the drawer, and each figure's child inherits them. Nothing of it reaches a file."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 3))
    FigureCanvasAgg(fig)
    axes = fig.add_subplot()
    axes.bar([0.5], [1e9])
    axes.set(yscale="log", ylim=(1, 1e9), title="title", xlabel="x")
    fig.savefig(io.BytesIO(), format="png", dpi=100)


def _leave(signum, frame) -> None:
    raise SystemExit(1)


Child = tuple[Path, int, int]  # a figure's path, the pid of the child drawing it, the read end of its error pipe


def _fork_drawing(path: Path, make: Callable[[], Figure]) -> Child:
    """Fork a child that saves ``make()`` at ``path`` and leaves; its traceback, if any, comes back on a pipe."""
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
    return Path(path), pid, read


def _collect(children: list[Child]) -> list[str]:
    """Wait for every child; ``"path: last line of its error"`` for each that failed."""
    errors = []
    while children:
        path, pid, read = children.pop(0)
        with os.fdopen(read, "rb") as pipe:
            text = pipe.read().decode(errors="replace").strip()
        _, status = os.waitpid(pid, 0)
        if status != 0:
            errors.append(f"{path}: {text.splitlines()[-1] if text else f'drawing process ended ({status})'}")
    return errors


def _stop(children: list[Child]) -> None:
    """Stop what still draws (its temporary file is removed) and forget the children."""
    for _, pid, read in children:
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(read)
    children.clear()


class _Drawer:
    """The process forked by :func:`preload`: it imports matplotlib, then forks one child per figure it is sent
    (``(path, make, args, kwargs)``, pickled: ``make`` a module-level function) until it is sent ``None``, waits for
    them and answers the list of their errors. A closed request pipe (the parent gone) or SIGTERM stops it and
    its children."""

    def __init__(self) -> None:
        requests_read, self._requests = os.pipe()
        self._replies, replies_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(self._requests)
                os.close(self._replies)
                code = _serve(requests_read, replies_write)
            finally:
                os._exit(code)
        os.close(requests_read)
        os.close(replies_write)
        self._sent = os.fdopen(self._requests, "wb")

    def send(self, path: Path, make: Callable[..., Figure], args: tuple, kwargs: dict) -> None:
        pickle.dump((Path(path), make, args, kwargs), self._sent, protocol=pickle.HIGHEST_PROTOCOL)
        self._sent.flush()

    def finish(self) -> list[str]:
        """The figures' errors once every child has ended; the drawer ends too."""
        self._sent.close()  # after None: the drawer's last read
        with os.fdopen(self._replies, "rb") as replies:
            data = replies.read()
        _, status = os.waitpid(self.pid, 0)
        if not data:
            return [f"figure drawing process ended ({status}) before answering"]
        return pickle.loads(data)

    def end(self) -> None:
        """Send the end of the requests; :meth:`finish` collects the answer."""
        pickle.dump(None, self._sent)
        self._sent.flush()

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        for close in (self._sent.close, lambda: os.close(self._replies)):
            try:
                close()
            except OSError:
                pass


def _serve(requests_fd: int, replies_fd: int) -> int:
    """The drawer's life (:class:`_Drawer`); returns its exit code."""
    children: list[Child] = []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _leave)
    try:
        import torch

        torch.set_num_threads(1)
        _import_matplotlib()
        _warm_up()
        with os.fdopen(requests_fd, "rb") as requests:
            while (request := pickle.load(requests)) is not None:
                path, make, args, kwargs = request
                children.append(_fork_drawing(path, partial(make, *args, **kwargs)))
        errors = _collect(children)
        with os.fdopen(replies_fd, "wb") as replies:
            replies.write(pickle.dumps(errors))
        return 0
    except BaseException:  # noqa: BLE001 - the parent left (EOFError), stopped us, or a request failed to load
        _stop(children)
        return 1


_DRAWER: _Drawer | None = None


def preload() -> None:
    """Fork the drawer (:class:`_Drawer`) now, once: it imports matplotlib beside the cases (1 CPU s here), on a
    core the evaluation leaves free, and the next :class:`FigureProcesses` sends it its figures. Nothing where
    figures are not drawn in parallel. Call :func:`release` where the figures may not come (an error)."""
    global _DRAWER
    if _DRAWER is None and _parallel():
        _DRAWER = _Drawer()


def release() -> None:
    """Stop a drawer that no :class:`FigureProcesses` took (the evaluation ended before its figures)."""
    global _DRAWER
    if _DRAWER is not None:
        _DRAWER.stop()
        _DRAWER = None


class FigureProcesses:
    """``with FigureProcesses() as figures: figures.start(path, make, *args, **kwargs); ...; figures.wait()``:
    ``make(*args, **kwargs)`` returns the Figure saved at ``path`` (module docstring)."""

    def __init__(self) -> None:
        global _DRAWER
        self._drawer, _DRAWER = _DRAWER, None  # the preloaded drawer, if any, draws this evaluation's figures
        self._children: list[Child] = []
        self._here: list[tuple[Path, Callable[[], Figure]]] = []

    def start(self, path: Path, make: Callable[..., Figure], *args, **kwargs) -> None:
        if self._drawer is not None:
            try:
                self._drawer.send(path, make, args, kwargs)
                return
            except OSError:  # the drawer is gone (killed): the figures are forked from here
                self._drawer.stop()
                self._drawer = None
        if _parallel():
            self._children.append(_fork_drawing(Path(path), partial(make, *args, **kwargs)))
        else:
            self._here.append((Path(path), partial(make, *args, **kwargs)))

    def wait(self) -> None:
        """Draw the figures kept for this process, then wait for the children; :class:`FigureError` if any
        failed."""
        if self._drawer is not None:
            self._drawer.end()
        for path, make in self._here:
            save_png(path, make())
        self._here = []
        errors = _collect(self._children)
        if self._drawer is not None:
            drawer, self._drawer = self._drawer, None
            errors += drawer.finish()
        if errors:
            raise FigureError("figure not written: " + "; ".join(errors))

    def __enter__(self) -> FigureProcesses:
        return self

    def __exit__(self, *exc) -> None:
        _stop(self._children)  # left early: stop what still draws
        if self._drawer is not None:
            self._drawer.stop()
            self._drawer = None

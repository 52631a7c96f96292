"""Cases of a folder command run in N worker processes, their results returned in case order, with a progress bar.

``map_cases(job, cases, workers)`` yields ``job(case)`` for every case, in the order of ``cases``, whatever the
order in which the workers finish: a caller that merges each case's partial result as it comes (per-case rows,
bin sums) adds the same numbers in the same order as one process does, so its outputs are the same to the last
byte. The N workers are the calling process and N - 1 children: the caller scores a case itself whenever the
next result in order is not ready (it merges every case, so as a bystander it took a core's share from the
children). Memory stays bounded: a worker holds one case at a time, and at most :data:`AHEAD` cases per worker
are handed out beyond the one the caller waits for, so results that are volumes (a fit's log-probabilities) wait
for the caller a few at a time, never a whole folder's; the caller keeps what it merges.

Workers are forked where the platform can (Linux: no second import of torch and mcseg, the job's folders and
reference inherited as they are), spawned elsewhere (then ``job`` must pickle: a :func:`functools.partial` of a
module-level function). Each worker uses one torch thread and ignores Ctrl-C: the interrupt reaches the main
process, which stops the pool (every worker) as it leaves. The progress bar (tqdm, cases per second) goes to stderr
on a terminal and stays quiet otherwise.
"""
from __future__ import annotations

import io
import math
import multiprocessing
import multiprocessing.pool
import pickle
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

__all__ = ["map_cases", "check_workers"]

_JOB: Callable | None = None  # a worker's job (set by _start)
AHEAD = 2  # cases handed out per worker beyond the one awaited: workers stay busy, unclaimed results stay few


def check_workers(workers: int, option: str = "--workers") -> int:
    """``workers`` as a number of processes: at least 1."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"{option}={workers!r}: expected a number of worker processes >= 1")
    return workers


def map_cases(job: Callable[[str], T], cases: Sequence[str], workers: int = 1, desc: str = "cases",
              when_running: Callable[[], None] | None = None) -> Iterator[T]:
    """``job(case)`` for each of ``cases``, in order; in ``workers`` processes when more than one (module
    docstring). An error of a case is raised here, as it would be by ``job`` itself. ``when_running()`` is called
    once the workers are forked (with one worker: at the start), e.g. to fork a process the workers should not
    copy (figure_processes.preload)."""
    from tqdm import tqdm

    workers = min(check_workers(workers), max(1, len(cases)))
    with tqdm(total=len(cases), desc=desc, unit="case", disable=None, leave=False, dynamic_ncols=True,
              file=sys.stderr) as bar:
        if workers == 1:
            if when_running is not None:
                when_running()
            for case in cases:
                yield job(case)
                bar.update()
            return
        # the first case in this process: what a case imports lazily (scipy.spatial, ...) and its first touch of
        # memory are then paid once, and the forked workers inherit them, instead of once in every worker
        yield job(cases[0])
        bar.update()
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        import torch

        threads = torch.get_num_threads()
        with _Pool(workers - 1, initializer=_start, initargs=(job,), context=context) as pool:  # leaving: terminated
            if when_running is not None:
                when_running()
            torch.set_num_threads(1)  # this process scores cases beside the children: one thread each, as they
            try:
                for result in _in_order(pool, workers - 1, job, cases[1:]):
                    yield result
                    bar.update()
            finally:
                torch.set_num_threads(threads)


def _in_order(pool: multiprocessing.pool.Pool, children: int, job: Callable[[str], T],
              cases: Sequence[str]) -> Iterator[T]:
    """``job(case)`` for each case in order, scored by the pool's ``children`` or by this process: each child is
    handed up to :data:`AHEAD` cases beyond the one awaited; while the next result in order is a child's and not
    ready, this process scores the next case itself (at most :data:`AHEAD` such results wait here). A case scored
    here is neither pickled nor copied, so this process, which merges every case, is one of the ``workers``
    instead of a bystander: 2 workers are this process and one child."""
    waiting: dict[int, object] = {}  # index -> a child's AsyncResult, or the result scored here (_Here)
    handed = children_busy = here_waiting = 0
    for index in range(len(cases)):
        while True:
            while handed < len(cases) and children_busy < AHEAD * children:  # children first: they stay busy
                waiting[handed] = pool.apply_async(_run, (cases[handed],))
                handed, children_busy = handed + 1, children_busy + 1
            next_one = waiting[index]
            if isinstance(next_one, _Here) or next_one.ready() or handed == len(cases) or here_waiting >= AHEAD:
                break
            waiting[handed] = _Here(job(cases[handed]))
            handed, here_waiting = handed + 1, here_waiting + 1
        next_one = waiting.pop(index)
        if isinstance(next_one, _Here):
            here_waiting -= 1
            yield next_one.result
        else:
            children_busy -= 1
            yield pickle.loads(next_one.get())


class _Here:
    """A case's result scored by the calling process (told apart from a child's AsyncResult)."""

    __slots__ = ("result",)

    def __init__(self, result) -> None:
        self.result = result


class _Pool(multiprocessing.pool.Pool):
    """A pool whose worker handler does not wake for the workers' results. CPython's own (3.8 to 3.13) waits on
    the result pipe beside the workers' and the notifier's sentinels, and the pipe stays readable until the
    result thread has read a whole result: meanwhile that handler loops (``wait`` returns at once, every worker
    polled, again), taking the GIL and a core from the main process; 2.3 ms of CPU a hippocampus case of 1 MB,
    0.9 ms at 0.4 MB (thread CPU times, 124 cases). It only maintains the workers (their exits are sentinels of
    their own) and leaves when the pool is closed or terminated (said on the notifier), as the ThreadPool's."""

    def _get_sentinels(self):
        return [self._change_notifier._reader]


def _start(job: Callable) -> None:
    global _JOB
    _JOB = job
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    import torch

    torch.set_num_threads(1)  # N workers on N cores; torch's own threads would oversubscribe them


def _run(case: str) -> bytes:
    # pickled here into bytes, which travel through the pool's pipe as they are: a result holding torch tensors,
    # handed to the pool as it is, goes through torch's multiprocessing reductions, which move every tensor to
    # shared memory and pass its file descriptor over a socket of its own; for the dozens of small tensors of a
    # scored case that took 5 of the main process's 6 CPU seconds on 60 hippocampus cases (py-spy), and as much
    # in the workers
    buffer = io.BytesIO()
    _CasePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(_JOB(case))
    return buffer.getvalue()


class _CasePickler(pickle.Pickler):
    """A pickler that writes a plain CPU tensor as its numpy array (the same dtype, shape and bits; read back by
    ``torch.from_numpy``): torch's own ``__reduce_ex__`` runs ``torch.save`` and ``torch.load`` for every tensor,
    0.8 ms each, 18 ms for the 37 tensors of a scored hippocampus case against about 1 ms this way, and the main
    process, which unpickles every case, was the bottleneck of 2 workers on a thousand cases."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import torch  # once a case, not once an object pickled

        self._torch = torch

    def reducer_override(self, obj):
        torch = self._torch
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided \
                and not obj.requires_grad:
            try:
                array = obj.numpy()
            except (TypeError, RuntimeError):  # a dtype numpy does not have (bfloat16), a conjugate view, ...
                return NotImplemented
            return _occupied(array) or (torch.from_numpy, (array,))
        return NotImplemented


SPARSE_MIN = 1024  # entries: a smaller array travels whole (the scan for its zeros would cost more than it saves)


def _occupied(array):
    """``(_dense, (shape, dtype, index, values))`` for an array of at least :data:`SPARSE_MIN` entries that are
    mostly zero bits: the flat indices of its nonzero entries and their values, a third of the bytes or less.
    A worker's case fills few of the pooled histograms' bins (26,625 fine bins of the pooled adaptive ECE, 2^16
    bins per uncertainty map of failure detection): sent whole they were most of a hippocampus case's 1 MB,
    pickled in the worker and copied, read and unpickled by the main process, which shares the cores with the
    workers. None for any other array (it travels whole). Zero is tested on the bits: -0.0 is not zero here,
    so the array rebuilt by :func:`_dense` has the same bits."""
    import numpy as np

    size = array.dtype.itemsize
    if array.size < SPARSE_MIN or size not in (1, 2, 4, 8):
        return None
    flat = array.reshape(-1)
    index = np.flatnonzero(flat.view(f"u{size}") != 0)
    if index.size * (size + 4) * 3 > flat.nbytes:
        return None
    return _dense, (array.shape, array.dtype, index.astype(np.int32 if flat.size < 2**31 else np.int64), flat[index])


def _dense(shape, dtype, index, values):
    """The tensor of :func:`_occupied`'s parts: zeros, and ``values`` at the flat ``index``."""
    import numpy as np
    import torch

    flat = np.zeros(math.prod(shape), dtype=dtype)
    flat[index] = values
    return torch.from_numpy(flat.reshape(shape))

"""Device choice, seeding, determinism switches and the CPUs a process may use."""
from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import platform
import random
import time

import numpy as np
import torch

log = logging.getLogger(__name__)
# cuBLAS's deterministic workspace, which torch.use_deterministic_algorithms needs on CUDA (else it only warns):
# MONAI's import sets this default (monai/utils/misc.py); mcseg imports MONAI only where it is used (#58), so it
# sets the same default itself, before any cuBLAS call, for the runs and commands that no longer import MONAI early
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def cuda_expected() -> str | None:
    """Why this machine looks meant for CUDA (torch built with it, an NVIDIA device), or None."""
    if torch.version.cuda:
        return f"torch {torch.__version__} is built with CUDA {torch.version.cuda}"
    if glob.glob("/dev/nvidia[0-9]*"):
        return "an NVIDIA device is present (/dev/nvidia*)"
    return None


def cuda_unusable(name: str) -> str:
    """The one-line error for ``trainer.device=<name>`` when CUDA cannot be used."""
    if not torch.version.cuda:
        return (f"trainer.device={name!r} but torch {torch.__version__} is a CPU build: install a CUDA build of "
                "torch, then MCSEG_GPU=1 bash scripts/setup.sh (README, 'Set up and run')")
    return (f"trainer.device={name!r} but CUDA is unusable (torch {torch.__version__}, CUDA {torch.version.cuda}: "
            "torch.cuda.is_available() is false; check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES)")


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when usable, else CPU (with a warning when CUDA was expected);
    an unusable CUDA device asked for by name is an error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        expected = cuda_expected()
        if expected:
            log.warning("trainer.device=auto: %s but CUDA is unusable (torch.cuda.is_available() is false): "
                        "training on the CPU; trainer.device=cuda makes this an error", expected)
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"trainer.device={name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(cuda_unusable(name))
    return device


def available_cpus() -> int:
    """CPUs this process may use, not the node's count (oversubscription was the worst slowdown the
    benchmarks found): its affinity mask, which a cgroup cpuset or SLURM's binding sets; inside an
    srun task at most ``SLURM_CPUS_PER_TASK`` (its allotment, also when SLURM does not bind it);
    under torchrun, whose processes on a node inherit one mask, that mask's share per process
    (``LOCAL_WORLD_SIZE``). At least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS, Windows)
        cpus = os.cpu_count() or 1
    if os.environ.get("SLURM_STEP_ID") and os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        cpus = min(cpus, int(os.environ["SLURM_CPUS_PER_TASK"]))
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        cpus //= max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    return max(1, cpus)


def helper_processes(cap: int = 8) -> int:
    """Processes for a parallel job the main process waits on (preprocessing): the available CPUs
    less the main process's, at least 1, at most ``cap``."""
    return max(1, min(cap, available_cpus() - 1))


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def describe_device(device: torch.device, precision: str, channels_last: bool, compile: bool) -> dict:
    """What a run trains on (logged at its start and kept in ``result.json``)."""
    cuda = device.type == "cuda"
    return {
        "device": str(device),
        "name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "precision": "bf16" if cuda and precision == "bf16" else "float32",  # see inference.autocast_context
        "channels_last": bool(channels_last),
        "compile": bool(compile),
        "cpu_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "runtime default"),
        "freed_memory": keep_freed_memory(),
    }


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
KEEP_BYTES = 1 << 30
_kept_memory: str | None = None


def keep_freed_memory() -> str:
    """Let glibc keep the memory torch frees, instead of giving it back to the kernel after every tensor.

    glibc serves a request above its mmap threshold (at most 32 MiB by default) with a fresh ``mmap`` and
    unmaps it when freed, and returns the free top of the heap above ``M_TRIM_THRESHOLD``. A training step
    frees and reallocates the same activations every step, so each large one comes back as new pages that
    the kernel faults in and zeroes: the 2D U-Net of the margin-loss study (batch 32 x 64 x 64, 33.5 MB
    activations) took 180,000 minor page faults and 1.36 to 1.54 s a step on one CPU thread, and 26,000 and
    1.01 to 1.11 s after this (docs/benchmarks.md, "The margin-loss authors' U-Net"). So both thresholds are
    raised to 1 GiB (``mallopt``; where glibc refuses that threshold, mmap is turned off instead); the
    process keeps up to 1 GiB of freed memory for reuse. Other C libraries, other systems and
    ``MCSEG_KEEP_FREED_MEMORY=0`` are left alone. Once per process; returns what was done (the run's
    device record names it).
    """
    global _kept_memory
    if _kept_memory is not None:
        return _kept_memory
    if os.environ.get("MCSEG_KEEP_FREED_MEMORY", "1") == "0":
        _kept_memory = "off (MCSEG_KEEP_FREED_MEMORY=0)"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _kept_memory = "unchanged (not glibc)"
    else:
        libc = ctypes.CDLL(None)  # the C library the process already uses
        trim = libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES) == 1
        if libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) == 1:
            _kept_memory = "glibc mallopt: mmap and trim thresholds 1 GiB" if trim else "glibc mallopt: mmap 1 GiB"
        elif libc.mallopt(_M_MMAP_MAX, 0) == 1:
            _kept_memory = "glibc mallopt: mmap off, trim threshold 1 GiB"
        else:
            _kept_memory = "unchanged (glibc refused mallopt)"
    log.debug("freed memory: %s", _kept_memory)
    return _kept_memory


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = not deterministic
    # torch.use_deterministic_algorithms imports torch._inductor (1-2 s at every start, #58) to set its flag: called
    # only where it changes something (on, or off after an earlier run of this process turned it on)
    if deterministic or torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(deterministic, warn_only=True)


def use_channels_last(setting: str | bool, device: torch.device, spatial_dims: int, model: torch.nn.Module) -> bool:
    """``trainer.channels_last``: ``auto`` is on for 2D networks on CUDA without instance norm.

    cuDNN's convolutions run faster in NHWC with bf16 on tensor cores; its 3D (NDHWC)
    kernels gain less and some are slower, and the CPU gains nothing. Instance norm (MONAI
    UNet's and DynUNet's default) runs as a batch norm over a ``1 x (N*C) x H x W`` view,
    which needs NCHW: every such layer converts the activation there and back, forward and
    backward, which costs more than the convolutions gain (docs/benchmarks.md). ``true``
    forces it (2D and 3D), ``false`` disables it.
    """
    value = str(setting).lower()
    if value not in ("auto", "true", "false"):
        raise ValueError(f"trainer.channels_last={setting!r}: expected auto, true or false")
    if value == "auto":
        instance_norm = any(isinstance(m, torch.nn.modules.instancenorm._InstanceNorm) for m in model.modules())
        return device.type == "cuda" and spatial_dims == 2 and not instance_norm
    return value == "true"


def to_channels_last(module: torch.nn.Module, spatial_dims: int) -> torch.nn.Module:
    """Put ``module``'s 4D/5D parameters in the channels-last layout (in place)."""
    return module.to(memory_format=torch.channels_last if spatial_dims == 2 else torch.channels_last_3d)


def runqueue_waits() -> dict[int, int] | None:
    """Nanoseconds each thread of this process has spent runnable but waiting for a CPU (Linux
    ``/proc/self/task/<tid>/schedstat``, second field), by thread id; None where unavailable."""
    waits = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                waits[int(tid)] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that just ended, or no scheduler statistics
            continue
    return waits or None


class AdaptiveThreads:
    """torch's intra-op threads, used only while the machine has the cores for them.

    On a CPU shared with another busy process, every OpenMP parallel region of torch waits for its
    slowest thread, and a thread that lost its core to the competitor holds up the others: a 2D
    training step took 4.2x and a hippocampus evaluation 9x their quiet time beside one competing
    torch process, while one thread per process ran at 2.1x and 1.6x (docs/benchmarks.md, "Under
    load"). No OpenMP setting fixed that without a loss on a quiet machine (``OMP_WAIT_POLICY=PASSIVE``
    doubled the quiet 2D step), and the wait policy cannot be changed once torch is loaded; the
    number of threads can. So :meth:`tick`, called between units of work (training steps,
    evaluated cases), reads how long the process's threads waited in the scheduler's run queue over
    the last ``interval_s`` (runnable, but another process had the core): summed over threads, more
    than ``busy`` of the wall time means the cores are shared, and it drops to one thread; it
    probes all threads again after ``backoff_s`` (doubling while the machine stays busy, at most
    ``max_backoff_s``), but not while even its one thread waits more than ``busy_alone`` of the time
    (the cores are still taken; a probe would cost a whole unit of work, e.g. a CT case, at the
    contended speed). Time a thread spends asleep or in serial code does not count, so a quiet
    machine keeps every thread. A process with one thread, on a GPU, or without Linux scheduler
    statistics is left alone; ``MCSEG_ADAPTIVE_THREADS=0`` turns it off.

    **Deterministic runs keep their threads.** The thread count decides how torch splits a reduction
    (a convolution's weight gradient, a sum) and so the order of its floating-point additions: one
    change mid-run made every weight of a tiny deterministic run differ (issue #21). While torch's
    deterministic algorithms are on (``trainer.deterministic=true``, :func:`seed_everything`),
    :meth:`tick` restores the configured count and changes nothing, whatever the load.
    """

    def __init__(self, device: torch.device | str = "cpu", interval_s: float = 1.0, busy: float = 0.3,
                 busy_alone: float = 0.1, backoff_s: float = 10.0, max_backoff_s: float = 120.0, clock=None,
                 waits=None) -> None:
        self.threads = torch.get_num_threads()
        self.clock, self.waits = clock or time.perf_counter, waits or runqueue_waits
        self.enabled = (torch.device(device).type == "cpu" and self.threads > 1
                        and os.environ.get("MCSEG_ADAPTIVE_THREADS", "1") != "0" and self.waits() is not None)
        self.interval_s, self.busy, self.busy_alone = interval_s, busy, busy_alone
        self.backoff_s, self.min_backoff_s, self.max_backoff_s = backoff_s, backoff_s, max_backoff_s
        self.reduced_until: float | None = None
        self.reductions = 0
        self.contention_warned = False
        if self.enabled:
            self._start()

    def _start(self) -> None:
        self.t0, self.waits0 = self.clock(), self.waits() or {}

    def tick(self) -> None:
        if not self.enabled:
            return
        if torch.are_deterministic_algorithms_enabled():  # reproducible numerics before speed (class docstring)
            self.restore()
            self._warn_once_if_contended()
            return
        now = self.clock()
        elapsed = now - self.t0
        if self.reduced_until is not None:  # on one thread
            if elapsed >= self.interval_s:
                if self._waited() > self.busy_alone * elapsed:  # even one thread waits: no probe yet
                    self.reduced_until = max(self.reduced_until, now + self.min_backoff_s)
                self._start()
            if now >= self.reduced_until:  # probe all threads again
                torch.set_num_threads(self.threads)
                self.reduced_until = None
                self._start()
            return
        if elapsed < self.interval_s:
            return
        waited = self._waited()
        if waited > self.busy * elapsed:
            torch.set_num_threads(1)
            self.reductions += 1
            self.reduced_until = now + self.backoff_s
            log.debug("CPU threads: the process's threads waited %.0f%% of the wall time for a core: 1 thread "
                      "for %.0f s", 100 * waited / elapsed, self.backoff_s)
            self.backoff_s = min(2 * self.backoff_s, self.max_backoff_s)
        else:
            self.backoff_s = self.min_backoff_s
        self._start()

    def _warn_once_if_contended(self) -> None:
        """A deterministic run on shared cores keeps its threads and can run many times slower (measured:
        10-25x beside three busy processes on 2 cores, docs/reliability.md): said once, with the remedy."""
        now = self.clock()
        elapsed = now - self.t0
        if self.contention_warned or elapsed < self.interval_s:
            return
        waited = self._waited()
        self._start()
        if waited > self.busy * elapsed:
            self.contention_warned = True
            log.warning("the CPU is shared: this process's %d torch threads waited %.0f%% of the wall time for a "
                        "core; a deterministic run keeps its thread count (it orders float reductions) and can run "
                        "many times slower under load. For bitwise results on a shared machine start it with "
                        "OMP_NUM_THREADS=1 (docs/reliability.md, 'Same inputs, same numbers')",
                        self.threads, 100 * waited / elapsed)

    def _waited(self) -> float:
        """Seconds the process's threads waited in the run queue since :meth:`_start`."""
        current = self.waits() or {}
        return sum(max(0, ns - self.waits0.get(tid, 0)) for tid, ns in current.items()) / 1e9

    def restore(self) -> None:
        """All threads again (at the end of the governed work)."""
        if self.enabled and self.reduced_until is not None:
            torch.set_num_threads(self.threads)
            self.reduced_until = None


_PROCESS_THREADS: AdaptiveThreads | None = None


def share_cpu(device: torch.device | str) -> None:
    """Call between units of CPU work (a training step, an evaluated case, an LTS step): the process's
    one :class:`AdaptiveThreads` (made at the first call) adapts torch's threads to the CPU it gets."""
    global _PROCESS_THREADS
    if torch.device(device).type != "cpu":
        return
    if _PROCESS_THREADS is None:
        _PROCESS_THREADS = AdaptiveThreads()
    _PROCESS_THREADS.tick()


def torch_threads() -> int:
    """torch's intra-op threads as configured, not as :class:`AdaptiveThreads` lowered them for now."""
    return _PROCESS_THREADS.threads if _PROCESS_THREADS is not None and _PROCESS_THREADS.enabled \
        else torch.get_num_threads()


def thread_reductions() -> int:
    """How often :class:`AdaptiveThreads` dropped this process to one thread so far (0: never changed)."""
    return _PROCESS_THREADS.reductions if _PROCESS_THREADS is not None else 0


def keep_threads_of(recorded: int | None, source: str) -> None:
    """A deterministic run resumed in a process configured for another number of torch threads: take the
    run's own count (recorded in its checkpoint's environment), since the count sets the order of
    floating-point reductions; ``source`` names the checkpoint in the log line."""
    current = torch_threads()
    if not recorded or recorded == current:
        return
    log.warning("%s was trained with %d torch threads, this process has %d: resuming with %d, as a deterministic "
                "run must (the thread count decides the order of floating-point reductions)",
                source, recorded, current, recorded)
    torch.set_num_threads(recorded)
    if _PROCESS_THREADS is not None:
        _PROCESS_THREADS.threads = recorded


@contextlib.contextmanager
def deterministic_algorithms(on: bool):
    """torch's deterministic algorithms switched on for the block (when ``on``), then as they were."""
    before, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if on:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)

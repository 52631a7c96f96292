"""Peak memory and timing helpers of the benchmarks (scripts/benchmark.py): the process's resident set now and at
its peak (Linux ``/proc/self/status``, resettable with ``clear_refs``), the GPU's peak allocation, a device sync."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch


def _status_bytes(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss() -> int:
    return _status_bytes("VmRSS") or 0


def reset_host_peak() -> bool:
    """Reset the process's peak resident set (Linux ``clear_refs``); False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def host_peak() -> int:
    """Peak resident set since the last reset (VmHWM), else since the start (ru_maxrss)."""
    peak = _status_bytes("VmHWM")
    if peak is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak


@contextmanager
def peak_memory(device: torch.device, record: dict):
    """Record the peak host (and GPU) memory of the block into ``record`` (MB)."""
    reset_host_peak()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    yield
    record["peak_host_mb"] = round(host_peak() / 2**20, 1)
    if device.type == "cuda":
        record["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

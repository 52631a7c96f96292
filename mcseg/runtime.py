"""Device choice, seeding, determinism switches and the CPUs a process may use."""
from __future__ import annotations

import os
import random

import numpy as np
import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present, else CPU; an unavailable CUDA device is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"trainer.device={name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but no CUDA device is available")
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


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = not deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def use_channels_last(setting: str | bool, device: torch.device, spatial_dims: int) -> bool:
    """``trainer.channels_last``: ``auto`` is on for 2D networks on CUDA only.

    cuDNN's convolutions run faster in NHWC with bf16 on tensor cores; its 3D (NDHWC)
    kernels gain less and some are slower, and the CPU gains nothing, so ``auto`` leaves
    those in the default layout. ``true`` forces it (2D and 3D), ``false`` disables it.
    """
    value = str(setting).lower()
    if value not in ("auto", "true", "false"):
        raise ValueError(f"trainer.channels_last={setting!r}: expected auto, true or false")
    if value == "auto":
        return device.type == "cuda" and spatial_dims == 2
    return value == "true"


def to_channels_last(module: torch.nn.Module, spatial_dims: int) -> torch.nn.Module:
    """Put ``module``'s 4D/5D parameters in the channels-last layout (in place)."""
    return module.to(memory_format=torch.channels_last if spatial_dims == 2 else torch.channels_last_3d)

"""Device choice, seeding, determinism switches and the CPUs a process may use."""
from __future__ import annotations

import glob
import logging
import os
import platform
import random

import numpy as np
import torch

log = logging.getLogger(__name__)


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
    }


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = not deterministic
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

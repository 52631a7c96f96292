"""Multi-process training with ``torchrun``: the process group, its collectives and DDP.

``torchrun --nproc_per_node=N train.py ...`` starts N copies of the training script with
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in their environment (a submitit SLURM job of N
tasks gets them from :func:`export_submitit_environment`). :func:`init_distributed`
reads them, joins the process group (NCCL on CUDA, gloo on the CPU) and picks the device of
the process (``cuda:LOCAL_RANK``). Without those variables everything here is a no-op, so
the single-process code path is the same code.

The division of labour (see README, "Several GPUs"):

* every rank trains on a disjoint share of each epoch's samples (:class:`~mcseg.data.sampling.EpochSampler`
  with ``rank``/``world_size``), gradients are averaged by DDP;
* the training loss is reduced across ranks once per logging interval;
* validation, checkpoints, TensorBoard, the test evaluation and result files are rank 0's;
  the other ranks wait at a barrier meanwhile.

Waiting for another rank: :meth:`DistContext.barrier` (also taken before each broadcast from rank
0) is kept in the process group's key-value store, not in a collective, so a waiting rank polls it
and stops within a second when a rank reported a failure (:meth:`DistContext.report_failure`, from
``train``) or when the store is unreachable, i.e. rank 0's process, which hosts it without torchrun,
is gone. A collective would wait for the process group's timeout instead: rank 0 validating for
an hour must not trip it, so it was two hours, and a crashed rank 0 under submitit (no torchrun
agent to end the others) left the other ranks holding their GPUs that long. The collectives that
remain are the ones every rank enters together during training, under torch's default timeout
(NCCL 10 minutes, gloo 30 minutes); a barrier waits at most ``BARRIER_TIMEOUT``.
"""
from __future__ import annotations

import datetime
import itertools
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mcseg.errors import ConfigError
from mcseg.models import computes_unused_outputs
from mcseg.runtime import resolve_device

log = logging.getLogger(__name__)

# Rank 0 validates (and preprocesses, checkpoints) while the others wait at a barrier: allow that
# to take long; a failure ends the wait at once (see the module docstring).
BARRIER_TIMEOUT = datetime.timedelta(hours=2)
POLL_SECONDS = 0.2
FAILED_KEY = "mcseg/failed"
_barrier_ids = itertools.count()  # every rank takes the same barriers in the same order


class RankFailed(RuntimeError):
    """Another rank of the job failed (or rank 0's process is gone): this one stops too."""


def _store_barrier(store, world_size: int, name: str, timeout: datetime.timedelta = BARRIER_TIMEOUT) -> None:
    """Wait until ``world_size`` processes reached barrier ``name`` of ``store``; raise
    :class:`RankFailed` as soon as a rank reported a failure or the store is unreachable."""
    key = f"mcseg/barrier/{name}"
    deadline = time.monotonic() + timeout.total_seconds()
    try:
        arrived, wait = store.add(key, 1), 0.001
        while arrived < world_size:
            if store.check([FAILED_KEY]):
                raise RankFailed(f"stopping: {store.get(FAILED_KEY).decode()}")
            if time.monotonic() > deadline:
                raise RankFailed(f"stopping: {world_size - arrived} rank(s) did not reach a barrier in {timeout}")
            time.sleep(wait)
            wait = min(2 * wait, POLL_SECONDS)  # a short wait stays short, a long one costs few polls
            arrived = store.add(key, 0)
    except RankFailed:
        raise
    except RuntimeError as exc:  # the store's host (rank 0's process, without torchrun) has exited
        raise RankFailed(f"stopping: the process group's store is unreachable, rank 0 has probably failed "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the job; ``world_size == 1`` is a plain single-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------ collectives (no-ops alone)
    def barrier(self) -> None:
        """Wait for every rank; stops this one if another failed (see the module docstring)."""
        if self.enabled:
            _store_barrier(dist.distributed_c10d._get_default_store(), self.world_size, str(next(_barrier_ids)))

    def report_failure(self, exc: BaseException) -> None:
        """Tell the other ranks, waiting at a barrier, that this one failed with ``exc``."""
        if not self.enabled:
            return
        first = str(exc).splitlines()[0] if str(exc) else ""
        try:
            dist.distributed_c10d._get_default_store().set(FAILED_KEY, f"rank {self.rank} failed: "
                                                                       f"{type(exc).__name__}: {first}")
        except (RuntimeError, ValueError):  # no process group (yet), or its store is gone already
            pass

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``world_size x *shape`` stack of every rank's ``tensor`` (same shape on every rank)."""
        if not self.enabled:
            return tensor[None]
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor)
        return torch.stack(out)

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum over ranks, in place."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def all_gather_object(self, obj) -> list:
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        self.barrier()  # the others may wait long (rank 0 validating): in the store, not in the collective
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @contextmanager
    def main_first(self):
        """Run the block on rank 0 first, then on the others (they find its files: split, cache)."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()


def export_submitit_environment() -> None:
    """In a SLURM job of several tasks started by submitit (``hydra/launcher=slurm`` with
    ``hydra.launcher.tasks_per_node=N``), set torchrun's variables from SLURM's."""
    if not os.environ.get("SUBMITIT_EXECUTOR") or "WORLD_SIZE" in os.environ:
        return
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    if JobEnvironment().num_tasks > 1:  # each task keeps every GPU visible and uses cuda:LOCAL_RANK
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def env_context() -> DistContext:
    """The torchrun (or submitit) environment of this process (single process when it is absent)."""
    export_submitit_environment()
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world <= 1:
        return DistContext()
    try:
        return DistContext(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", 0)),
                           int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    except KeyError as exc:
        raise RuntimeError(f"WORLD_SIZE={world} but {exc} is not set: start multi-process runs with torchrun") from None


def init_distributed(device_name: str) -> tuple[DistContext, torch.device]:
    """Join the torchrun process group (if any) and return it with this process's device.

    ``device_name`` is ``trainer.device``: under torchrun a CUDA run uses ``cuda:LOCAL_RANK``
    (an explicit other index is an error), a CPU run uses gloo.
    """
    ctx = env_context()
    device = resolve_device(device_name)
    if not ctx.enabled:
        return ctx, device
    if device.type == "cuda":
        if device.index not in (None, ctx.local_rank):
            raise ConfigError(f"trainer.device={device_name!r} under torchrun: each process uses cuda:LOCAL_RANK; "
                              "set trainer.device=cuda or auto")
        device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    log.info("distributed training: rank %d of world size %d (local rank %d), backend %s, device %s",
             ctx.rank, ctx.world_size, ctx.local_rank, backend, device)
    return ctx, device


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: torch.nn.Module, ctx: DistContext, device: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel when several processes train it, else itself."""
    if not ctx.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=computes_unused_outputs(model))


class StopVote:
    """Ranks agree on a stop (SIGTERM/SIGINT on any rank) one step after it was asked for.

    Each step starts an all-reduce of this rank's flag and reads the one started the step
    before (long finished), on a CPU gloo group of its own: no wait for the device, and every
    rank sees the same answer at the same step. Single process: the flag itself.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.group = dist.new_group(backend="gloo") if ctx.enabled else None
        self.pending: tuple | None = None

    def _collect(self) -> bool:
        if self.pending is None:
            return False
        work, flag = self.pending
        work.wait()
        self.pending = None
        return bool(flag.item())

    def step(self, requested: bool) -> bool:
        """Vote ``requested``; return the vote of the previous step (True: every rank stops now)."""
        if not self.ctx.enabled:
            return requested
        agreed = self._collect()
        flag = torch.tensor([int(requested)], dtype=torch.int32)
        self.pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True), flag)
        return agreed

    def now(self, requested: bool) -> bool:
        """Vote and wait for the answer (every rank calls it at the same point, e.g. after validation)."""
        if not self.ctx.enabled:
            return requested
        earlier = self._collect()
        flag = torch.tensor([int(requested)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return earlier or bool(flag.item())

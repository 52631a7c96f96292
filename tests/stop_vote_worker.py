"""What each of two gloo processes sees of :class:`~mcseg.training.distributed.StopVote` (test_distributed.py);
a module of its own so that the spawned processes import little."""
from __future__ import annotations

import json

import torch.distributed as dist

from mcseg.training.distributed import DistContext, StopVote


def vote(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ballot = StopVote(DistContext(rank, 2, rank, 2))
    seen = [ballot.step(rank == 1 and step >= 2) for step in range(5)]  # only rank 1 is signalled, before step 2
    seen.append(ballot.now(False))
    seen.append(StopVote(DistContext(rank, 2, rank, 2)).now(rank == 0))  # e.g. during rank 0's validation
    dist.destroy_process_group()
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(seen, f)

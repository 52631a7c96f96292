"""torchrun: ranks draw disjoint shares of each epoch, and DDP on two CPU processes (gloo) trains
exactly like one process with the global batch."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mcseg.data.sampling import EpochSampler
from mcseg.inference.build import load_checkpoint
from mcseg.training.distributed import DistContext, env_context
from mcseg.train import train

from .conftest import ROOT, TINY_2D


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_draw_disjoint_equal_shares_of_each_epoch(world):
    n, epoch = 10, 2
    samplers = [EpochSampler(n, rank, world) for rank in range(world)]
    shares = []
    for sampler in samplers:
        sampler.set_epoch(epoch)
        shares.append(list(sampler))
    assert [len(s) for s in shares] == [len(s) for s in samplers] == [n // world] * world
    drawn = [i for share in shares for i in share]
    assert len(set(drawn)) == len(drawn)  # disjoint
    assert set(drawn) == set(range(epoch * n, epoch * n + world * (n // world)))  # the epoch's own indices
    assert shares[-1] == list(range(epoch * n + world - 1, epoch * n + world * (n // world), world))  # r::world
    samplers[-1].set_epoch(epoch, skip=1)  # a resumed epoch leaves out what this rank already drew
    assert list(samplers[-1]) == shares[-1][1:] and len(samplers[-1]) == len(shares[-1]) - 1


def test_sampler_refuses_fewer_samples_than_ranks():
    with pytest.raises(ValueError, match="samples_per_epoch=2"):
        EpochSampler(2, 0, 4)


def test_single_process_context_without_torchrun(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    ctx = env_context()
    assert ctx == DistContext() and ctx.is_main and not ctx.enabled
    t = torch.arange(3.0)
    assert torch.equal(ctx.all_gather(t), t[None]) and ctx.broadcast_object("x") == "x"


def _weights(run) -> dict:
    return load_checkpoint(run / "checkpoints/last.pt")["model"]


def _max_difference(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a if a[k].is_floating_point())


@pytest.mark.slow
def test_torchrun_two_cpu_processes_train_like_one_process_with_the_global_batch(make_cfg, tmp_path, one_thread):
    # SGD keeps gradients linear in the weights' update, so the comparison is to rounding error;
    # each rank takes batches of 2 from its half of every epoch: together the batches of 4 of one process
    common = TINY_2D + ["optim=sgd", "dataset.sampling.samples_per_epoch=8"]
    run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
         *common, "trainer.device=cpu", f"hydra.run.dir={run}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} of world size 2" in output, output[-4000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]  # rank 0's only
    assert (run / "eval/test/summary.json").is_file()

    train(make_cfg(common + ["dataset.sampling.batch_size=4"], output_dir=tmp_path / "global_batch"))
    train(make_cfg(common, output_dir=tmp_path / "rank_batch"))
    ddp = _weights(run)
    assert _max_difference(ddp, _weights(tmp_path / "global_batch")) < 1e-6
    assert _max_difference(ddp, _weights(tmp_path / "rank_batch")) > 1e-3  # the comparison can tell runs apart


def test_a_submitit_job_of_several_tasks_becomes_a_torchrun_environment(monkeypatch):
    slurm = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_PROCID": "3",
             "SLURM_LOCALID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(key, "unset")  # recorded, so that what the export writes is undone
        monkeypatch.delenv(key)
    assert env_context() == DistContext(rank=3, world_size=4, local_rank=1, local_world_size=2)
    assert os.environ["MASTER_ADDR"] == "gpu07" and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_ranks_agree_on_a_stop_one_step_after_any_rank_asks(tmp_path):
    """torchrun signals every rank but not at the same instant (and SLURM may signal one): every rank
    must stop at the same step, a step after the request, without waiting for the device."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from .stop_vote_worker import vote

    mp.spawn(vote, args=(port, str(tmp_path)), nprocs=2)
    expected = [False, False, False, True, True, True, True]
    assert [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)] == [expected, expected]


@pytest.mark.slow  # 23 s of two torchrun processes; CI runs it with the slow tests (.ci/run)
def test_torchrun_rank_signalled_alone_stops_every_rank_at_the_same_step(tmp_path, one_thread):
    """SIGTERM to rank 1 only (its process group, loader workers included): both ranks stop one step later,
    rank 0 writes last.pt at that step, and resuming under torchrun finishes the run."""
    run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MCSEG_GROUP_SIGNAL_AT_STEP": "3",
           "MCSEG_SIGNAL_RANK": "1"}
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(ROOT / "tests/interrupt_wrapper.py"), *TINY_2D, "optim=sgd", "dataset.sampling.samples_per_epoch=32",
            "dataset.sampling.num_workers=1", "trainer.device=cpu", "trainer.max_epochs=2",
            "trainer.log_every_n_steps=20", f"hydra.run.dir={run}"]  # no read of the loss inside the epoch: the vote
    stopped = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                             start_new_session=True)
    output = stopped.stdout + stopped.stderr
    assert "stopped by SIGTERM at epoch 1, step 4" in output, output[-4000:]  # asked before step 3, agreed after 4
    assert "exitcode  : 143" in output and "exitcode  : 1 " not in output, output[-4000:]  # both ranks interrupted
    state = load_checkpoint(run / "checkpoints/last.pt")
    assert (state["epoch"], state["step_in_epoch"]) == (0, 4)
    env.pop("MCSEG_GROUP_SIGNAL_AT_STEP")
    resumed = subprocess.run([*args, "trainer.resume=true"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    assert load_checkpoint(run / "checkpoints/last.pt")["epoch"] == 2

"""The training step costs nothing it need not: no host reads per step, deferred non-finite checks,
label checks on the first step only, layout and compile switches, bounded evaluation memory."""
from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import mcseg
from mcseg.inference.build import load_checkpoint
from mcseg.training.trainer import Trainer
from mcseg.errors import ConfigError, NonFiniteLossError
from mcseg.losses import CEDiceLoss
from mcseg.losses.base import target_checks
from mcseg.runtime import use_channels_last
from mcseg.train import train

from .conftest import CONFIG_DIR, ROOT, TINY_2D, TINY_3D, compose_config
from .test_reliability import _poison

LOSSES = sorted(p.stem for p in (Path(CONFIG_DIR) / "loss").glob("*.yaml"))
MULTILABEL = {"bce", "spa"}  # targets B x R x spatial in {0, 1}

HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


@pytest.fixture
def host_reads(monkeypatch):
    """Host reads of tensors (``t.item()``, ``bool(t)``, ``t.cpu()`` ...) made by mcseg's own code
    while ``counts.active``; on a GPU each is a synchronisation. Maps call site -> count."""
    package = str(Path(mcseg.__file__).parent)
    counts = collections.Counter()
    counts.active = False
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, _name=name, **kwargs):
            frame = sys._getframe(1)
            if counts.active and frame.f_code.co_filename.startswith(package):
                counts[f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {_name}"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counts


def _count_during_train_epoch(monkeypatch, counts) -> None:
    original = Trainer.train_epoch

    def counted(self, epoch):
        counts.active = True
        try:
            return original(self, epoch)
        finally:
            counts.active = False

    monkeypatch.setattr(Trainer, "train_epoch", counted)


def test_training_steps_read_nothing_back_from_the_device(make_cfg, monkeypatch, host_reads, one_thread):
    steps = 16
    _count_during_train_epoch(monkeypatch, host_reads)
    train(make_cfg(TINY_2D + ["trainer.max_epochs=1", "trainer.log_every_n_steps=100",
                              f"dataset.sampling.samples_per_epoch={2 * steps}"]))
    # the first step's label check (one read) and the epoch's one window read (cpu + tolist)
    assert sum(host_reads.values()) <= 3, dict(host_reads)


def test_host_reads_follow_the_logging_interval_not_the_steps(make_cfg, monkeypatch, host_reads, one_thread):
    _count_during_train_epoch(monkeypatch, host_reads)
    train(make_cfg(TINY_2D + ["trainer.max_epochs=1", "trainer.log_every_n_steps=4",
                              "dataset.sampling.samples_per_epoch=32"]))  # 16 steps: 4 logging reads
    window_reads = sum(n for site, n in host_reads.items() if site.startswith("window.py"))
    assert window_reads == 2 * 5, dict(host_reads)  # 4 intervals + the epoch's end, 2 calls each


def test_nan_found_at_the_next_read_names_the_bad_step_and_no_checkpoint_follows_it(make_cfg, tmp_path,
                                                                                    monkeypatch):
    # 4 steps an epoch, a checkpoint every 2 steps, the loss read only at those checkpoints;
    # the poisoned sample is in the first batch of epoch 2, found when step 2 would be checkpointed
    _poison(monkeypatch, at_sample=8)
    cfg = make_cfg(TINY_2D + ["dataset.sampling.samples_per_epoch=8", "trainer.checkpoint_every_n_steps=2",
                              "trainer.log_every_n_steps=100"])
    with pytest.raises(NonFiniteLossError,
                       match=r"non-finite loss at epoch 2, step 0 \(batch of training cases \['synthetic2d_"):
        train(cfg)
    state = load_checkpoint(tmp_path / "run/checkpoints/last.pt")
    assert (state["epoch"], state["step_in_epoch"]) == (1, 0)  # written before the bad step, not after
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_out_of_range_label_is_a_clear_error_at_the_first_step(make_cfg, monkeypatch):
    from mcseg.data.sampling import PatchDataset

    original = PatchDataset.__getitem__

    def bad_label(self, index):
        sample = original(self, index)
        sample["label"][0, 0] = 9
        return sample

    monkeypatch.setattr(PatchDataset, "__getitem__", bad_label)
    with pytest.raises(ValueError, match=r"target holds label 9 outside \[0, 3\]"):
        train(make_cfg(TINY_2D))


class _DeviceTraffic(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every operation that brings host data to the ``meta`` device (a host-to-device copy:
    on CUDA, from pageable memory, a synchronisation) or reads a device value back (``item``)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        host = [t for t in leaves if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0]
        device = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_meta]
        if (host and device) or func is torch.ops.aten._local_scalar_dense.default:
            self.seen.append(str(func))
        return out


@functools.lru_cache(maxsize=None)
def _loss_node(name: str) -> dict:
    return OmegaConf.to_container(compose_config("train", TINY_2D + [f"loss={name}"], ROOT / "unused").loss,
                                  resolve=True)


def _loss_on_the_device(name: str, dims: int):
    """The loss of ``configs/loss/<name>.yaml`` on the ``meta`` device (which stands for an
    accelerator) and a step's logits and target there."""
    from mcseg.targets import instantiate_checked

    loss = instantiate_checked(_loss_node(name), "loss").to("meta")
    spatial = (8,) * dims
    logits = torch.empty(2, 4, *spatial, device="meta", requires_grad=True)
    if name in MULTILABEL:
        target = torch.empty(2, 4, *spatial, device="meta")
    else:
        target = torch.empty(2, *spatial, dtype=torch.long, device="meta")
    return loss, logits, target


@pytest.mark.parametrize("dims", [2, 3], ids=["2d", "3d"])
@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_config_steps_without_host_traffic(name, dims):
    """The part of a training step that changes with ``loss=``: after its first call (which may
    build caches), a loss's forward and backward neither copy host data to the device (SVLS and
    NACL once copied their kernel every step) nor read a value back. (The label-range check of a
    run's first step is the one accepted read; the rest of the step is checked with CE by the
    tests above and, on a GPU, by ``test_cuda_training_steps_never_synchronise`` for every loss.)"""
    loss, logits, target = _loss_on_the_device(name, dims)
    with target_checks(loss, False):
        loss(logits, target).backward()
        traffic = _DeviceTraffic()
        with traffic:
            loss(logits, target).backward()
    assert traffic.seen == [], f"{name}: {traffic.seen}"


def test_target_checks_switch_the_range_check_of_every_sub_loss(host_reads):
    loss = CEDiceLoss()
    logits, target = torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2, 8, 8))
    host_reads.active = True
    loss(logits, target)
    assert sum(host_reads.values()) == 1  # the min/max read of the range check
    host_reads.clear()
    with target_checks(loss, False):
        assert not any(getattr(m, "check_target_range", False) for m in loss.modules())
        loss(logits, target)
    assert sum(host_reads.values()) == 0
    assert loss.check_target_range
    with pytest.raises(ValueError, match="outside"):
        loss(logits, torch.full_like(target, 3))


@pytest.mark.parametrize(
    ("setting", "device", "dims", "norm", "expected"),
    [("auto", "cpu", 2, "batch", False), ("auto", "cuda", 2, "batch", True), ("auto", "cuda", 3, "batch", False),
     ("auto", "cuda", 2, "instance", False), ("True", "cpu", 3, "instance", True),
     ("true", "cuda", 2, "instance", True), ("False", "cuda", 2, "batch", False)],
)
def test_channels_last_auto_is_for_2d_on_cuda_without_instance_norm(setting, device, dims, norm, expected):
    """Instance norm converts NHWC back to NCHW at every layer (forward and backward): ``auto`` leaves it off."""
    from monai.networks.nets import UNet

    model = UNet(dims, 1, 2, channels=(4, 8), strides=(2,), norm=norm)
    assert use_channels_last(setting, torch.device(device), dims, model) is expected


def test_channels_last_bad_value_names_the_key(make_cfg):
    from mcseg.config import validate_train_config

    with pytest.raises(ConfigError, match="trainer.channels_last"):
        validate_train_config(make_cfg(TINY_2D + ["trainer.channels_last=sometimes"]))


@pytest.mark.parametrize("tiny", [TINY_2D, TINY_3D], ids=["2d", "3d"])
def test_channels_last_training_runs_and_checkpoints_plain_weights(make_cfg, tmp_path, monkeypatch, tiny, one_thread):
    layouts = []
    original = Trainer._train_step

    def spy(self, batch, epoch, step):
        kernels = [p for p in self.model.parameters() if p.ndim >= 4]
        fmt = torch.channels_last if kernels[0].ndim == 4 else torch.channels_last_3d
        layouts.append((all(p.is_contiguous(memory_format=fmt) for p in kernels),
                        all(p.is_contiguous() for p in kernels)))
        return original(self, batch, epoch, step)

    monkeypatch.setattr(Trainer, "_train_step", spy)
    train(make_cfg(tiny + ["trainer.channels_last=true", "trainer.max_epochs=1"]))
    assert layouts and all(last and not default for last, default in layouts)  # changed from the default layout
    state = load_checkpoint(tmp_path / "run/checkpoints/last.pt")
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


@pytest.mark.slow  # 38 s of compiling on 2 cores; CI runs it with the other slow tests (.ci/run)
@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++", "c++")),
                    reason="torch.compile on the CPU needs a C++ compiler")
def test_compiled_training_checkpoints_the_plain_model(make_cfg, tmp_path, one_thread):
    train(make_cfg(TINY_2D + ["trainer.compile=true", "trainer.max_epochs=1"]))
    state = load_checkpoint(tmp_path / "run/checkpoints/last.pt")
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in state["model"])


def test_build_train_loader_takes_workers_from_the_config(make_cfg):
    from mcseg.training.loader import PREFETCH_BATCHES, build_train_loader, default_workers, load_cases
    from mcseg.data.build import build_dataset

    cfg = make_cfg(TINY_2D + ["dataset.sampling.num_workers=2"])
    dataset = build_dataset(cfg.dataset)
    cases = load_cases(dataset, dataset.case_refs()[:2], workers=1)
    loader, _ = build_train_loader(cases, cfg.dataset, 0, torch.device("cpu"))
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor, loader.pin_memory) == (
        2, True, PREFETCH_BATCHES, False)
    cfg.dataset.sampling.num_workers = None
    loader, _ = build_train_loader(cases, cfg.dataset, 0, torch.device("cpu"))
    assert loader.num_workers == default_workers(torch.device("cpu"))
    cfg.dataset.sampling.num_workers = -1
    with pytest.raises(ConfigError, match="dataset.sampling.num_workers"):
        build_train_loader(cases, cfg.dataset, 0, torch.device("cpu"))


def test_loader_workers_survive_sigterm_and_stop_when_asked(make_cfg):
    """SLURM and torchrun signal every process of the job: a worker that died of it would fail the run before
    the main process checkpoints. Since they ignore SIGTERM, the trainer ends them itself (stop_workers)."""
    from mcseg.training.loader import build_train_loader, load_cases, stop_workers
    from mcseg.data.build import build_dataset

    cfg = make_cfg(TINY_2D + ["dataset.sampling.num_workers=1", "dataset.sampling.samples_per_epoch=16"])
    dataset = build_dataset(cfg.dataset)
    loader, sampler = build_train_loader(load_cases(dataset, dataset.case_refs()[:2], workers=1), cfg.dataset, 0,
                                         torch.device("cpu"))
    sampler.set_epoch(0)
    batches = iter(loader)
    next(batches)
    workers = list(loader._iterator._workers)
    for w in workers:
        os.kill(w.pid, signal.SIGTERM)
    assert len([next(batches) for _ in range(3)]) == 3
    stop_workers(loader)
    assert not any(w.is_alive() for w in workers) and loader._iterator is None


@pytest.mark.parametrize(
    ("device", "threads", "processes", "expected"),
    [("cuda", 16, 1, 8), ("cuda", 16, 2, 7), ("cuda", 16, 8, 1), ("cuda", 16, 32, 0),
     ("cpu", 16, 1, 0), ("cpu", 4, 1, 8), ("cpu", 1, 4, 3)],
)
def test_default_workers_take_the_cores_the_step_leaves_free(monkeypatch, device, threads, processes, expected):
    """16 CPUs allotted on a 128-CPU node; ``processes`` torchrun processes share them."""
    from mcseg.training.loader import default_workers

    monkeypatch.setattr("os.cpu_count", lambda: 128)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    # the threads as configured: not those an earlier in-process run of this session left in mcseg.runtime
    monkeypatch.setattr("mcseg.runtime._PROCESS_THREADS", None)
    assert default_workers(torch.device(device)) == expected


@pytest.mark.slow
def test_a_large_volume_is_evaluated_holding_at_most_two_probability_tensors():
    """Sliding-window inference, softmax and every metric of one 256 x 256 x 160 volume with 5
    classes (200 MB of probabilities; small windows, so the volume dominates): peak memory above
    the input is at most two float32 probability tensors (logits and probabilities, while
    converting). Before the logits were released and the evaluation's voxel temporaries shrunk
    it was about three. (Smaller volumes measure noise: pages of shared libraries dropped and
    faulted back in by the kernel count too; one run in CI read 2.19 where others read 2.02-2.04,
    so the smaller of two independent measurements is compared.)"""
    results = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts/benchmark.py"), "eval-memory", "--shape", "256", "256", "160",
             "--classes", "5", "--roi", "32", "32", "32", "--sw-batch-size", "2", "--device", "cpu"],
            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if not results[0]["host_peak_resettable"]:
        pytest.skip("the peak resident set cannot be reset here (/proc/self/clear_refs)")
    assert min(r["copies_of_probability_tensor"] for r in results) <= 2.1, results


@pytest.mark.cuda
@pytest.mark.parametrize("loss", LOSSES)
def test_cuda_training_steps_never_synchronise(make_cfg, tmp_path, loss):
    """After the first step (its label check) a step launches work and returns: CUDA's sync
    debug mode turns any synchronising call inside ``_train_step`` into an error, for every loss."""
    if loss in MULTILABEL:
        from .data.data_helpers import TINY_RUN, fake_download

        _, overrides = fake_download("brats_regions", tmp_path)
        overrides = [o for o in overrides if not o.startswith("loss=")] + TINY_RUN
    else:
        overrides = TINY_2D
    captured = {}

    def capture(self):
        captured["trainer"] = self
        raise KeyboardInterrupt

    original = Trainer.fit
    Trainer.fit = capture
    try:
        with pytest.raises(KeyboardInterrupt):
            train(make_cfg(overrides + [f"loss={loss}", "trainer.device=cuda",
                                        "dataset.sampling.samples_per_epoch=12"]))
    finally:
        Trainer.fit = original
    trainer = captured["trainer"]
    trainer.train_module.train()
    trainer.sampler.set_epoch(0)
    batches = list(trainer.loader)
    trainer._train_step(batches[0], 0, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step, batch in enumerate(batches[1:], start=1):  # pinned by the loader
            trainer._train_step(batch, 0, step)
    finally:
        torch.cuda.set_sync_debug_mode("default")

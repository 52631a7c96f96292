"""The training loader's paths deliver the same batches: in the training process, from workers through the
shared batch ring (mcseg.training.ring), and from device-resident cases (mcseg.training.device_cache)."""
from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from mcseg.data.build import build_dataset
from mcseg.data.cases import CaseData
from mcseg.data.sampling import PatchDataset
from mcseg.errors import ConfigError
from mcseg.training.device_cache import DeviceLoader, cases_bytes, choose_device_cache
from mcseg.training.loader import build_train_loader, load_cases, stop_workers

from .conftest import TINY_2D, TINY_3D

AUGMENTED = ["dataset.sampling.flip_axes=[0,1,2]", "dataset.sampling.intensity=0.1", "+dataset.augment.rotate_deg=30",
             "+dataset.augment.scale=[0.8,1.25]", "+dataset.augment.spatial_prob=0.5", "+dataset.augment.gamma=[0.7,1.5]",
             "+dataset.augment.noise_std=0.1", "+dataset.augment.intensity_prob=0.5"]
AUGMENTED_2D = [a for a in AUGMENTED if "flip_axes" not in a] + ["dataset.sampling.flip_axes=[0,1]"]
SMALL = ["dataset.sampling.batch_size=3", "dataset.sampling.samples_per_epoch=7"]  # a partial batch is dropped


def compact_cases(cfg, n=3):
    """Three cases with uint8 labels, as the preprocessing cache keeps them."""
    dataset = build_dataset(cfg.dataset)
    return [replace(c, label=c.label.astype(np.uint8)) for c in load_cases(dataset, dataset.case_refs()[:n], workers=1)]


def batches(cfg, overrides: dict, epochs=(0, 1), skip=0):
    """Every batch of ``epochs`` (the first leaving out ``skip`` samples) from the loader ``overrides`` build."""
    for key, value in overrides.items():
        cfg.dataset.sampling[key] = value
    loader, sampler = build_train_loader(compact_cases(cfg), cfg.dataset, 5, torch.device("cpu"))
    out = []
    for n, epoch in enumerate(epochs):
        sampler.set_epoch(epoch, skip=skip if n == 0 else 0)
        out += [{k: v.clone() if torch.is_tensor(v) else v for k, v in b.items()} for b in loader]
    stop_workers(loader)
    return out


def assert_same(expected: list[dict], actual: list[dict]) -> None:
    assert len(actual) == len(expected) > 0
    for a, e in zip(actual, expected):
        assert a.keys() == e.keys() and a["case_id"] == e["case_id"]
        for key in ("image", "label", "case_index"):
            assert a[key].dtype == e[key].dtype and torch.equal(a[key], e[key]), key


PATHS = [{"num_workers": 1}, {"num_workers": 2}, {"device_cache": True}]


@pytest.mark.parametrize("path", PATHS, ids=["ring-1-worker", "ring-2-workers", "device-cache"])
def test_every_path_delivers_the_in_process_batches(make_cfg, path):
    cfg = make_cfg(TINY_3D + SMALL + AUGMENTED)
    expected = batches(cfg, {"num_workers": 0, "device_cache": False})
    assert_same(expected, batches(cfg, path))


def test_device_cache_2d_slices_of_volumes_are_the_in_process_ones(make_cfg):
    cfg = make_cfg(TINY_3D + SMALL + AUGMENTED + ["dataset.sampling.dims=2", "dataset.sampling.patch_size=[16,20]",
                                                  "dataset.sampling.flip_axes=[0,1]", "dataset.sampling.slice_axis=1"])
    expected = batches(cfg, {"num_workers": 0, "device_cache": False})
    assert_same(expected, batches(cfg, {"device_cache": True}))


def test_ring_slots_are_reused_without_overwriting_a_batch_before_the_next_is_taken(make_cfg):
    """More batches than slots (1 worker x 4 in flight + 3): each batch, read when it arrives, is the in-process one."""
    cfg = make_cfg(TINY_3D + ["dataset.sampling.batch_size=2", "dataset.sampling.samples_per_epoch=20"])
    expected = batches(cfg, {"num_workers": 0}, epochs=(0, 1, 2))
    assert_same(expected, batches(cfg, {"num_workers": 1}, epochs=(0, 1, 2)))


class MarkedSamples:
    """Sample ``j``: an image and a label filled with ``j``; taking it leaves the file ``<folder>/<j>``, so that the
    mark of a batch's second sample says its first is in the ring (a worker puts its samples one after another)."""

    def __init__(self, n: int, folder) -> None:
        self.n, self.folder = n, folder

    def __getitem__(self, j: int) -> dict:
        (self.folder / str(j)).touch()
        return {"image": torch.full((1, 3, 3), float(j)), "label": torch.full((3, 3), j, dtype=torch.uint8),
                "case_index": j, "case_id": f"case_{j}"}

    def __len__(self) -> int:
        return self.n


def test_a_batch_kept_uncopied_is_intact_while_the_loader_yields_the_next(tmp_path):
    """ring.py's promise: a batch's views stay valid while the loader yields the batch after it. Each batch is kept
    as the loader's views while the next is taken; then, once the worker has put a sample into the slot of every
    task handed out so far (the sampler's count), the kept batch still holds its own samples. A ring with one
    spare slot instead of 3 hands the kept batch's slot to a task as the next batch arrives and fails here
    (deterministically: the wait is for the worker's own marks, not a time)."""
    from torch.utils.data import SequentialSampler

    from mcseg.training.loader import PREFETCH_BATCHES
    from mcseg.training.ring import RingLoader

    batch, n_batches = 2, 12
    samples = MarkedSamples(batch * n_batches, tmp_path)
    loader = RingLoader(samples, SequentialSampler(range(len(samples))), batch, True, 1, PREFETCH_BATCHES)
    assert n_batches > loader.ring.slots  # every slot is reused
    kept, seen = None, 0
    try:
        for i, current in enumerate(loader):
            if kept is not None:
                last_task = loader.workers.sampler.issued - 1
                mark = tmp_path / str(last_task * batch + 1)  # the last task's second sample: its first is put
                deadline = time.monotonic() + 60
                while not mark.exists():
                    assert time.monotonic() < deadline, f"the loader worker never took sample {mark.name}"
                    time.sleep(0.005)
                rows = torch.arange((i - 1) * batch, i * batch)
                assert torch.equal(kept["image"][:, 0, 0, 0], rows.float()), f"batch {i - 1} overwritten"
                assert torch.equal(kept["label"][:, 0, 0], rows.to(torch.uint8)), f"batch {i - 1} overwritten"
                assert kept["case_id"] == [f"case_{j}" for j in rows.tolist()]
            kept, seen = current, seen + 1
    finally:
        stop_workers(loader)
    assert seen == n_batches


@pytest.mark.parametrize("path", PATHS[::2], ids=["ring", "device-cache"])
def test_a_resumed_epoch_continues_the_same_batches(make_cfg, path):
    cfg = make_cfg(TINY_3D + ["dataset.sampling.batch_size=2", "dataset.sampling.samples_per_epoch=8"] + AUGMENTED)
    straight = batches(cfg, {"num_workers": 0, "device_cache": False}, epochs=(1,))
    assert_same(straight[2:], batches(cfg, path, epochs=(1,), skip=4))


@pytest.mark.parametrize("value", ["yes", 1, "on-gpu", None])
def test_a_wrong_device_cache_value_names_the_key(make_cfg, value):
    cfg = make_cfg(TINY_3D)
    cfg.dataset.sampling.device_cache = value
    with pytest.raises(ConfigError, match="dataset.sampling.device_cache"):
        build_train_loader(compact_cases(cfg, 1), cfg.dataset, 0, torch.device("cpu"))


@pytest.mark.parametrize(("value", "expected"), [("auto", False), ("false", False), (False, False), ("true", True),
                                                 (True, True), ("TRUE", True)])
def test_device_cache_auto_keeps_cpu_runs_on_the_worker_path(make_cfg, value, expected):
    cfg = make_cfg(TINY_3D + ["dataset.sampling.num_workers=0"])
    cfg.dataset.sampling.device_cache = value
    loader, _ = build_train_loader(compact_cases(cfg, 1), cfg.dataset, 0, torch.device("cpu"))
    assert isinstance(loader, DeviceLoader) is expected and loader.data_path["device_cache"] is expected
    assert loader.data_path["why"].startswith("auto: cpu is not a CUDA device" if value == "auto" else "dataset.sampling")


def test_device_cache_refuses_soft_rater_targets_when_forced():
    samples = PatchDataset(raters_cases(), 3, (8, 8, 8), 4, rater_target="mean", num_classes=3)
    assert choose_device_cache("auto", samples, torch.device("cpu"))[0] is False
    with pytest.raises(ConfigError, match="device_cache=true: soft rater targets"):
        choose_device_cache(True, samples, torch.device("cpu"))


def test_device_cache_auto_on_cuda_compares_the_cases_with_free_memory(monkeypatch):
    samples = PatchDataset(raters_cases(), 3, (8, 8, 8), 4, rater_target="random")
    size = cases_bytes(samples)
    assert size == sum(c.image.nbytes + c.label.size + c.raters.size for c in samples.cases)  # labels as uint8
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (4 * size + 4, 10 * size))
    assert choose_device_cache("auto", samples, cuda) == (True, f"auto: the cases take 0 MB, under 25% of the 0 MB "
                                                                 f"free on cuda:0")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (4 * size, 10 * size))
    assert choose_device_cache("auto", samples, cuda)[0] is False


def raters_cases(n=2):
    rng = np.random.default_rng(0)
    return [CaseData(f"r{i}", rng.random((1, 10, 10, 10), dtype=np.float32), rng.integers(0, 3, (10, 10, 10)),
                     (1.0,) * 3, np.eye(4), raters=rng.integers(0, 3, (2, 10, 10, 10))) for i in range(n)]


@pytest.mark.slow
def test_device_resident_training_resumes_bitwise(make_cfg, tmp_path, monkeypatch, one_thread):
    """Interrupted before its last epoch's checkpoint and resumed, a device-resident run ends where the straight
    run ends, bit for bit (its batches are the worker path's: test_every_path_delivers_the_in_process_batches)."""
    from mcseg.inference.build import load_checkpoint
    from mcseg.train import train
    from mcseg.training.trainer import Trainer

    common = TINY_2D + AUGMENTED_2D + ["trainer.max_epochs=2", "scheduler=constant", "trainer.deterministic=true",
                                    "dataset.sampling.samples_per_epoch=8", "dataset.n_cases=5"]
    device = common + ["dataset.sampling.device_cache=true"]
    train(make_cfg(device, output_dir=tmp_path / "straight"))
    validate = Trainer.validate

    def killed_in_the_last_validation(self, epoch, full=False):
        if epoch == 1:
            raise KeyboardInterrupt("simulated interruption")
        return validate(self, epoch, full)

    monkeypatch.setattr(Trainer, "validate", killed_in_the_last_validation)
    with pytest.raises(KeyboardInterrupt):
        train(make_cfg(device, output_dir=tmp_path / "resumed"))
    monkeypatch.setattr(Trainer, "validate", validate)
    train(make_cfg(device + ["trainer.resume=true"], output_dir=tmp_path / "resumed"))
    straight, resumed = (load_checkpoint(tmp_path / run / "checkpoints/last.pt")["model"] for run in ("straight", "resumed"))
    for key, value in straight.items():
        assert torch.equal(resumed[key], value), key
    recorded = json.loads((tmp_path / "resumed/result.json").read_text())["device"]["training_batches"]
    assert recorded == {"device_cache": True, "why": recorded["why"], "workers": 0}
    assert recorded["why"].startswith("dataset.sampling.device_cache=true: the cases take")


def test_benchmark_reports_the_loader_alone_by_path(make_cfg, monkeypatch, one_thread):
    """scripts/benchmark.py's rows of the loader alone: in process, by worker count, device-resident."""
    from types import SimpleNamespace

    from .conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    benchmark = __import__("benchmark")
    cfg = make_cfg(TINY_3D + ["dataset.sampling.samples_per_epoch=4"])
    loader, _ = build_train_loader(compact_cases(cfg, 2), cfg.dataset, 0, torch.device("cpu"))
    trainer = SimpleNamespace(loader=loader, device=torch.device("cpu"), channels_last=False)
    rates = benchmark.loader_paths(trainer, cfg, [0, 1], 0)
    assert list(rates) == ["in process", "1 worker", "device-resident"] and all(r > 0 for r in rates.values())


def test_device_cache_may_change_on_resume():
    """It decides how batches are made, not which: a run may resume on another device or path."""
    from mcseg.config import resume_mismatch

    saved = {"seed": 0, "dataset": {"name": "msd", "sampling": {"device_cache": "auto", "batch_size": 2}}}
    for value in (True, False):
        now = {"seed": 0, "dataset": {"name": "msd", "sampling": {"device_cache": value, "batch_size": 2}}}
        assert resume_mismatch(saved, now) is None


@pytest.mark.parametrize("path", PATHS[::2], ids=["ring", "device-cache"])
def test_an_epoch_smaller_than_a_batch_is_one_short_batch_on_every_path(make_cfg, path):
    cfg = make_cfg(TINY_3D + ["dataset.sampling.batch_size=3", "dataset.sampling.samples_per_epoch=2"])
    expected = batches(cfg, {"num_workers": 0, "device_cache": False}, epochs=(0,))
    assert [len(b["case_id"]) for b in expected] == [2]
    assert_same(expected, batches(cfg, path, epochs=(0,)))

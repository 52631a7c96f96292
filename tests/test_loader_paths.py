"""The training loader's paths deliver the same batches: in the training process, from workers through the
shared batch ring (mcseg.training.ring), and from device-resident cases (mcseg.training.device_cache)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from mcseg.data.build import build_dataset
from mcseg.training.loader import build_train_loader, load_cases, stop_workers

from .conftest import TINY_3D

AUGMENTED = ["dataset.sampling.flip_axes=[0,1,2]", "dataset.sampling.intensity=0.1", "+dataset.augment.rotate_deg=30",
             "+dataset.augment.scale=[0.8,1.25]", "+dataset.augment.spatial_prob=0.5", "+dataset.augment.gamma=[0.7,1.5]",
             "+dataset.augment.noise_std=0.1", "+dataset.augment.intensity_prob=0.5"]
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


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_deliver_the_in_process_batches_through_the_ring(make_cfg, workers):
    cfg = make_cfg(TINY_3D + SMALL + AUGMENTED)
    expected = batches(cfg, {"num_workers": 0})
    assert_same(expected, batches(cfg, {"num_workers": workers}))


def test_ring_slots_are_reused_without_overwriting_a_batch_before_the_next_is_taken(make_cfg):
    """More batches than slots (1 worker x 4 in flight + 3): each batch, read when it arrives, is the in-process one."""
    cfg = make_cfg(TINY_3D + ["dataset.sampling.batch_size=2", "dataset.sampling.samples_per_epoch=20"])
    expected = batches(cfg, {"num_workers": 0}, epochs=(0, 1, 2))
    assert_same(expected, batches(cfg, {"num_workers": 1}, epochs=(0, 1, 2)))


def test_a_resumed_epoch_continues_the_same_batches_from_workers(make_cfg):
    cfg = make_cfg(TINY_3D + ["dataset.sampling.batch_size=2", "dataset.sampling.samples_per_epoch=8"] + AUGMENTED)
    straight = batches(cfg, {"num_workers": 0}, epochs=(1,))
    assert_same(straight[2:], batches(cfg, {"num_workers": 1}, epochs=(1,), skip=4))

"""The device-resident training loader (``dataset.sampling.device_cache``): the training cases held on the
training device, patches cut and augmented there, no worker process and no copy per batch.

A sample's random choices are drawn on the host exactly as the worker path draws them
(:meth:`mcseg.data.sampling.PatchDataset.draw`) and applied by the same code to torch tensors on the device
(crops, flips, MONAI's ``Affine``, ``RandAdjustContrast`` and ``RandGaussianNoise``, which run on any device): on
the CPU device the batches are those of the worker path, bit for bit; on a GPU interpolation and arithmetic
run in its kernels, so augmented values may differ in the last bits.

``auto`` holds the cases on the device on CUDA when they take less than ``DEVICE_SHARE`` of its free memory
(the rest is left to the network, its activations and evaluation), never on the CPU (where the worker path
overlaps sampling with the step). Soft rater targets (``dataset.raters.target=mean``) are made by the worker path.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import BatchSampler, Sampler

from mcseg.data.sampling import PatchDataset
from mcseg.errors import ConfigError

log = logging.getLogger(__name__)

DEVICE_SHARE = 0.25  # auto: the cases may take at most this share of the device's free memory
SETTINGS = {"auto": "auto", "true": True, "false": False, True: True, False: False}


@dataclass
class DeviceCase:
    """One case's arrays on the device: ``image`` C x *S as stored, ``label`` and ``raters`` in the type labels
    travel in (:func:`mcseg.data.sampling.travel_dtype`)."""

    image: torch.Tensor
    label: torch.Tensor | None
    raters: torch.Tensor | None


def device_cache_setting(value) -> str | bool:
    """``dataset.sampling.device_cache`` as ``"auto"``, ``True`` or ``False``; anything else is an error naming it."""
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, (str, bool)) and key in SETTINGS:
        return SETTINGS[key]
    raise ConfigError(f"dataset.sampling.device_cache={value!r}: expected auto, true or false")


def cases_bytes(samples: PatchDataset) -> int:
    """What the cases take on the device: images as stored, labels and raters in their travel type."""
    per_label = samples.label_dtype.itemsize
    return sum(c.image.nbytes + sum(a.size * per_label for a in (c.label, c.raters) if a is not None)
               for c in samples.cases)


def choose_device_cache(setting, samples: PatchDataset, device: torch.device) -> tuple[bool, str]:
    """Whether the cases go on the device, and why (logged, and kept in ``result.json``)."""
    setting = device_cache_setting(setting)
    size = cases_bytes(samples)
    mb = f"{size / 2**20:.0f} MB"
    if setting is False:
        return False, "dataset.sampling.device_cache=false"
    if samples.mean_rater:
        if setting is True:
            raise ConfigError("dataset.sampling.device_cache=true: soft rater targets (dataset.raters.target=mean) "
                              "are made in loader workers; set device_cache to auto or false")
        return False, "auto: soft rater targets (dataset.raters.target=mean) are made in loader workers"
    if setting is True:
        return True, f"dataset.sampling.device_cache=true: the cases take {mb} on {device}"
    if device.type != "cuda":
        return False, f"auto: {device} is not a CUDA device"
    free = torch.cuda.mem_get_info(device)[0]
    fits = size < DEVICE_SHARE * free
    relation = "under" if fits else "over"
    return fits, f"auto: the cases take {mb}, {relation} {DEVICE_SHARE:.0%} of the {free / 2**20:.0f} MB free on {device}"


def to_device_case(case, dtype: np.dtype, device: torch.device) -> DeviceCase:
    def put(array, as_label: bool):
        if array is None:
            return None
        array = np.asarray(array, dtype=dtype) if as_label else np.asarray(array)
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    return DeviceCase(put(case.image, False), put(case.label, True), put(case.raters, True))


class DeviceLoader:
    """Batches cut on ``device`` from cases held there; iterated like the DataLoader it replaces (batch dicts of
    ``image``, ``label``, ``case_index``, ``case_id``; ``batch_size``, ``dataset``, ``num_workers`` 0, ``len``)."""

    num_workers = 0
    pin_memory = False

    def __init__(self, samples: PatchDataset, sampler: Sampler, batch_size: int, drop_last: bool,
                 device: torch.device) -> None:
        self.dataset, self.batch_size, self.device = samples, int(batch_size), device
        self.batches = BatchSampler(sampler, batch_size, drop_last)
        self.sources = [to_device_case(c, samples.label_dtype, device) for c in samples.cases]

    def __iter__(self) -> Iterator[dict]:
        for indices in self.batches:
            items = [self.dataset.sample(i, self.sources) for i in indices]
            yield {"image": torch.stack([it["image"] for it in items]),
                   "label": torch.stack([it["label"] for it in items]),
                   "case_index": torch.tensor([it["case_index"] for it in items], dtype=torch.int64),
                   "case_id": [it["case_id"] for it in items]}

    def __len__(self) -> int:
        return len(self.batches)

"""Batches that cross from loader workers for almost nothing: a ring of preallocated shared-memory batch buffers.

PyTorch's DataLoader collates each batch of a worker into freshly allocated shared memory, which the worker
faults in page by page, passes as a file descriptor, and the training process maps and faults in again
(docs/benchmarks.md, "Feeding the step"). Here the training process allocates a ring of batch
buffers in shared memory once, before the workers start; a worker samples each item of its batch straight into
the slot it was told (the slot number travels with the batch's indices), and sends back only the slot number
and the case ids. The training process hands out views of the slot: nothing is allocated, mapped or pickled per
batch. Samples, their order and their values are those of :class:`~mcseg.data.sampling.PatchDataset`.

A batch's views stay valid while the loader yields the batch after it (the previous batch may still be in use
by the step); the ring has ``prefetch + 3`` slots (``prefetch``: the batches the workers keep in flight).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from mcseg.data.sampling import PatchDataset

SPARE_SLOTS = 3  # beyond the batches in flight: the batch being used and the one before it, and one being filled


class BatchRing:
    """``slots`` batch buffers in shared memory, shaped after ``example`` (one sample of the dataset)."""

    def __init__(self, example: dict, batch_size: int, slots: int) -> None:
        self.slots, self.batch_size = int(slots), int(batch_size)
        self.image = _shared(slots, batch_size, example["image"])
        self.label = _shared(slots, batch_size, example["label"])

    def put(self, slot: int, row: int, sample: dict) -> None:
        """Copy one sample into row ``row`` of ``slot``; a sample of another shape or type is an error, not a cast."""
        for key, buffer in (("image", self.image), ("label", self.label)):
            value = sample[key]
            if value.shape != buffer.shape[2:] or value.dtype != buffer.dtype:
                raise ValueError(f"training sample {key}: {tuple(value.shape)} {value.dtype}, but the loader's batch "
                                 f"buffers hold {tuple(buffer.shape[2:])} {buffer.dtype} (every sample of a run must "
                                 f"have the first sample's shape and type)")
            buffer[slot, row].copy_(value)

    def batch(self, task: dict) -> dict:
        """The batch a worker filled (``task``: what :class:`RingFiller` returned), as views of its slot."""
        slot, n = task["slot"], len(task["case_id"])
        return {"image": self.image[slot, :n], "label": self.label[slot, :n],
                "case_index": torch.tensor(task["case_index"], dtype=torch.int64), "case_id": task["case_id"]}


def _shared(slots: int, batch_size: int, example: torch.Tensor) -> torch.Tensor:
    return torch.empty((slots, batch_size, *example.shape), dtype=example.dtype).share_memory_()


class RingFiller(Dataset):
    """What a worker runs per batch: samples ``indices`` into the ring's ``slot`` (a whole batch per task)."""

    def __init__(self, samples: PatchDataset, ring: BatchRing) -> None:
        self.samples, self.ring = samples, ring

    def __getitem__(self, task: tuple[int, list[int]]) -> dict:
        slot, indices = task
        case_index, case_id = [], []
        for row, index in enumerate(indices):
            sample = self.samples[index]
            self.ring.put(slot, row, sample)
            case_index.append(sample["case_index"])
            case_id.append(sample["case_id"])
        return {"slot": slot, "case_index": case_index, "case_id": case_id}

    def __len__(self) -> int:
        return len(self.samples)


class SlotSampler(Sampler):
    """``(slot, indices)`` per batch of ``batches``; slots go round the ring over the loader's whole life (not per
    epoch), in the order batches are handed to the workers, which is the order they are yielded."""

    def __init__(self, batches: BatchSampler, slots: int) -> None:
        self.batches, self.slots, self.issued = batches, int(slots), 0

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        for indices in self.batches:
            slot, self.issued = self.issued % self.slots, self.issued + 1
            yield slot, indices

    def __len__(self) -> int:
        return len(self.batches)


class RingLoader:
    """The training loader with workers: a DataLoader over :class:`RingFiller` tasks whose batches are views of a
    :class:`BatchRing`. It answers as the DataLoader it replaces does (``batch_size``, ``dataset``: the
    :class:`PatchDataset`, ``num_workers``, ``pin_memory``, ``len``), iterating batch dicts of the same keys,
    shapes, types and values."""

    def __init__(self, samples: PatchDataset, sampler: Sampler, batch_size: int, drop_last: bool, workers: int,
                 prefetch: int, **loader_args) -> None:
        self.dataset, self.batch_size = samples, int(batch_size)
        self.ring = BatchRing(samples[0], batch_size, workers * prefetch + SPARE_SLOTS)
        self.workers = DataLoader(
            RingFiller(samples, self.ring), batch_size=None,
            sampler=SlotSampler(BatchSampler(sampler, batch_size, drop_last), self.ring.slots),
            num_workers=workers, prefetch_factor=prefetch, persistent_workers=True, **loader_args,
        )

    def __iter__(self) -> Iterator[dict]:
        for task in self.workers:
            yield self.ring.batch(task)

    def __len__(self) -> int:
        return len(self.workers)

    def __getattr__(self, name: str):  # num_workers, pin_memory, prefetch_factor, persistent_workers, _iterator
        if name == "workers":
            raise AttributeError(name)
        return getattr(self.workers, name)

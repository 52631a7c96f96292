"""Loaded cases and the training loader; building a dataset and its split live below, in
:mod:`mcseg.data.build`."""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import signal
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from mcseg.config import SamplingConfig, typed
from mcseg.errors import ConfigError
from mcseg.data.base import SegmentationDataset
from mcseg.data.cases import CaseData, CaseRef
from mcseg.data.sampling import EpochSampler, PatchDataset
from mcseg.training.device_cache import DeviceLoader, choose_device_cache
from mcseg.training.ring import RingLoader
from mcseg.training.distributed import DistContext
from mcseg.runtime import available_cpus, torch_threads
from mcseg.text import plural

log = logging.getLogger(__name__)

PREFETCH_BATCHES = 4  # batches each loader worker prepares ahead of the training step
WORKER_START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"  # torch's defaults


def default_workers(device: torch.device) -> int:
    """Loader workers per training process: the CPUs it may use (:func:`~mcseg.runtime.available_cpus`:
    its affinity mask, its share under torchrun) that its training step leaves free, at most 8.

    A CUDA step keeps one core busy (the main process). A CPU step keeps torch's intra-op threads
    busy; with torch's default of one thread per core that is every core, and a CPU run then
    samples in the main process: a worker would only take time from the step (and stall its
    parallel regions while it runs) and add the cost of passing batches between processes.
    """
    share = available_cpus()
    busy = torch_threads() if device.type == "cpu" else 1
    return max(0, min(8, share - busy))


def load_cases(dataset: SegmentationDataset, refs: list[CaseRef], workers: int | None = None) -> list[CaseData]:
    """Load cases in threads (file decompression releases the GIL)."""
    workers = workers or available_cpus()
    if workers <= 1 or len(refs) <= 1:
        return [dataset.load(r) for r in refs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(dataset.load, refs))


def build_train_loader(
    cases: list[CaseData], node: DictConfig, seed: int, device: torch.device, dist: DistContext | None = None,
) -> tuple[DataLoader, EpochSampler]:
    """The training loader for ``device``: one of three paths to the same batches.

    * Device-resident (``dataset.sampling.device_cache``, :mod:`mcseg.training.device_cache`): the cases held on
      the device, patches cut there, no worker.
    * Workers (``dataset.sampling.num_workers`` > 0; null: :func:`default_workers`): they persist across epochs,
      keep ``PREFETCH_BATCHES`` batches each in flight and sample straight into a ring of shared batch buffers
      (:mod:`mcseg.training.ring`).
    * In the training process (no worker).

    :func:`to_device` copies host batches without blocking. Under torchrun each rank draws its own share of
    every epoch (``dist``). The choice and its reason are ``loader.data_path`` (logged; kept in ``result.json``).
    """
    s = typed(node.get("sampling"), SamplingConfig, "dataset.sampling")
    dist = dist or DistContext()
    dataset = PatchDataset(
        cases, s.dims, s.patch_size, s.samples_per_epoch, s.foreground_ratio, s.flip_axes, s.intensity,
        s.slice_axis, seed, augment=node.get("augment"),
        rater_target=(node.get("raters") or {}).get("target", "majority"), num_classes=node.get("num_classes"),
    )
    sampler = EpochSampler(s.samples_per_epoch, dist.rank, dist.world_size)
    workers = default_workers(device) if s.num_workers is None else s.num_workers
    if workers < 0:
        raise ConfigError(f"dataset.sampling.num_workers={workers}: expected an integer >= 0 or null")
    drop_last = len(sampler) >= s.batch_size
    on_device, why = choose_device_cache(s.device_cache, dataset, device)
    if on_device:
        loader, workers = DeviceLoader(dataset, sampler, s.batch_size, drop_last, device), 0
    elif workers == 0:
        loader = DataLoader(dataset, batch_size=s.batch_size, sampler=sampler, drop_last=drop_last,
                            pin_memory=device.type == "cuda", generator=torch.Generator().manual_seed(seed))
    else:  # batches sampled into shared buffers reused batch after batch (mcseg.training.ring)
        loader = RingLoader(
            dataset, sampler, s.batch_size, drop_last, workers, PREFETCH_BATCHES, pin_memory=device.type == "cuda",
            # The platform's own start method, named: inside a joblib (loky) launcher job the default
            # context is loky's, which cannot start DataLoader workers.
            multiprocessing_context=multiprocessing.get_context(WORKER_START_METHOD),
            # Its own generator: worker seeding must not consume the global RNG (exact resumes).
            generator=torch.Generator().manual_seed(seed), worker_init_fn=ignore_stop_signals,
        )
    loader.data_path = {"device_cache": on_device, "why": why, "workers": workers}
    log.info("training batches: %s (%s)", "cut on the device from device-resident cases" if on_device else
             plural(workers, "loader worker") if workers else "sampled in the training process", why)
    if workers > 0:  # before multiprocessing's own exit handler (atexit runs the last registered first)
        atexit.register(_stop_workers_at_exit, weakref.ref(loader))
    return loader, sampler


def ignore_stop_signals(worker_id: int = 0) -> None:
    """Loader workers ignore SIGTERM and SIGINT: SLURM, torchrun's agent and Ctrl-C signal the
    whole process group, and a worker that died of it would fail the run before the main process
    (which owns the stop) writes its checkpoint. The main process ends its workers itself."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_workers(loader: DataLoader) -> None:
    """End ``loader``'s persistent workers now (they are idle between epochs). They ignore SIGTERM
    (:func:`ignore_stop_signals`), so they must not be left to multiprocessing's exit handler,
    which terminates them with SIGTERM and then waits for them: the trainer calls this after
    fitting, and an exit handler for any other loader (a benchmark, a test)."""
    if isinstance(loader, RingLoader):
        loader = loader.workers
    iterator, loader._iterator = getattr(loader, "_iterator", None), None
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def _stop_workers_at_exit(ref: weakref.ref) -> None:
    loader = ref()
    if loader is not None:
        stop_workers(loader)


def to_device(batch: dict, device: torch.device, channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Image and label of a batch on ``device``; asynchronous from pinned memory on CUDA. Integer labels
    arrive in their compact type (uint8 for most tasks) and leave as int64, the losses' label type.

    ``channels_last``: the image in the channels-last layout (NHWC / NDHWC) the model was put in.
    """
    image = batch["image"].to(device, non_blocking=True)
    if channels_last:
        image = image.contiguous(memory_format=torch.channels_last if image.ndim == 4 else torch.channels_last_3d)
    label = batch["label"].to(device, non_blocking=True)
    if not label.is_floating_point() and label.dtype != torch.int64:  # compact labels (PatchDataset), widened here
        label = label.long()
    return image, label

"""The training loader alone (no network): samples/s by who samples, side by side in one run, and where a
batch's crossing from a worker process goes.

    python scripts/bench_loader.py                      # 3D recipe, batch 32, workers 0 and 1, alternating
    python scripts/bench_loader.py --workers 0 1 2 --device-cache
    python scripts/bench_loader.py --stock --phases     # also PyTorch's own collation with one worker, and
                                                        # each step of a batch's crossing there

Each configuration runs ``--epochs`` epochs of ``--batches`` batches, the configurations alternating epoch by
epoch so that a busy machine's load hits them alike; the median and range are printed with the machine's load
(``os.getloadavg``) before and after, and the CPU milliseconds per batch that the training process and the
workers spent (CPU time barely moves with the load; the rate does). One torch thread unless ``--threads`` says
otherwise; freed memory kept as a run keeps it (``mcseg.runtime.keep_freed_memory``). Output: one JSON object
(``--json`` also writes it to a file), with the command, its start and end (UTC) and the environment (code commit,
libraries, CPU), so that a committed file says what produced it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchmark import HIPPOCAMPUS, RECIPE_3D, compose, loader_rate  # noqa: E402

from mcseg.environment import environment_record  # noqa: E402
from mcseg.runtime import keep_freed_memory  # noqa: E402
from mcseg.training.loader import build_train_loader, load_cases, stop_workers  # noqa: E402


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def build_cases(args, tmp: Path):
    """The training cases of the hippocampus split, loaded as a run loads them."""
    from mcseg.data.build import build_dataset, resolve_split

    cfg = compose(["dataset=hippocampus", f"dataset.root={args.hippocampus}", *RECIPE_3D,
                   f"dataset.sampling.batch_size={args.batch}", *args.set, f"paths.output_dir={tmp}"])
    dataset = build_dataset(cfg.dataset)
    splits = resolve_split(dataset, cfg.dataset, tmp)
    dataset.prepare(splits["all"], progress=False)
    return cfg, load_cases(dataset, splits["train"])


def cpu_seconds(loader) -> tuple[float, float]:
    """CPU seconds used so far by this process and by ``loader``'s worker processes (``/proc/<pid>/stat``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    iterator = getattr(getattr(loader, "workers", loader), "_iterator", None)
    workers = 0.0
    for w in getattr(iterator, "_workers", []):
        fields = Path(f"/proc/{w.pid}/stat").read_text().rsplit(")", 1)[1].split()
        workers += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return time.process_time(), workers


def timed_epoch(loader, sampler, device, epoch: int) -> tuple[float, float, float]:
    """Samples/s of one epoch of the loader alone, and CPU milliseconds per batch in this process and in its
    workers: CPU time, unlike the rate, barely moves with the machine's load."""
    main0, workers0 = cpu_seconds(loader)
    rate = loader_rate(loader, sampler, device, epoch)
    main1, workers1 = cpu_seconds(loader)
    n = len(loader)
    return rate, 1000 * (main1 - main0) / n, 1000 * (workers1 - workers0) / n


def stock_loader(loader, sampler, workers: int):
    """PyTorch's DataLoader as mcseg built it before the batch ring: each batch collated by a worker into fresh
    shared memory, pickled, mapped by the training process."""
    import multiprocessing

    from torch.utils.data import DataLoader

    from mcseg.training.loader import PREFETCH_BATCHES, WORKER_START_METHOD

    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler, num_workers=workers,
                      persistent_workers=True, drop_last=True, prefetch_factor=PREFETCH_BATCHES,
                      multiprocessing_context=multiprocessing.get_context(WORKER_START_METHOD),
                      generator=torch.Generator().manual_seed(0))


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median CPU milliseconds of this thread in ``fn()`` over ``repeats`` calls (page faults and copies count,
    waiting for a busy core does not), and its last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.thread_time()
        out = fn()
        times.append(1000 * (time.thread_time() - start))
    return round(statistics.median(times), 2), out


def crossing_phases(samples, batch: int, loader, sampler, repeats: int = 5) -> dict:
    """CPU milliseconds per batch of each step a batch takes from a stock DataLoader worker to the training process.

    The worker's side is replayed in this process (one thread): sampling the batch's items, collating them into
    ordinary memory (what the training process does with no worker), allocating the shared storage a worker's
    collate allocates and collating into it (its pages faulted in on the way), pickling the batch for the queue
    (``ForkingPickler``: file descriptors of the shared storages). The training process's side is measured on
    ``loader`` (stock, one worker) once its worker has filled the queue: taking a ready batch (queue, unpickling,
    mapping the storages), then reading it the first time (the mapped pages faulted in, as the pin-memory copy
    or the step does) against a second read of the same memory (no faults). Pinning needs CUDA: the copy into a
    preallocated buffer stands for the pin-memory copy.
    """
    from multiprocessing.reduction import ForkingPickler

    from torch.utils.data import default_collate

    out = {}
    out["sample_items"], items = timed(lambda: [samples[i] for i in range(batch)], repeats)

    def collate_shared():
        fields = {}
        for key in ("image", "label"):
            parts = [it[key] for it in items]
            storage = parts[0].untyped_storage()._new_shared(sum(p.nbytes for p in parts))
            fields[key] = torch.stack(parts, out=parts[0].new(storage).resize_(len(parts), *parts[0].shape))
        return fields

    out["collate_plain"], _ = timed(lambda: default_collate(items), repeats)
    out["allocate_shared"], _ = timed(
        lambda: [it.untyped_storage()._new_shared(it.nbytes * batch) for it in (items[0]["image"], items[0]["label"])],
        repeats)
    out["collate_into_fresh_shared"], shared = timed(collate_shared, repeats)
    out["pickle"], _ = timed(lambda: ForkingPickler.dumps(shared), repeats)
    buffer = torch.empty_like(shared["image"])
    out["copy_into_buffer"], _ = timed(lambda: buffer.copy_(shared["image"]), repeats)
    sampler.set_epoch(0)
    batches = iter(loader)
    next(batches)
    time.sleep(2 * repeats * out["sample_items"] / 1000 + 1)  # the worker fills its queue
    takes, first, second = [], [], []
    for _ in range(min(repeats, len(loader) - 1)):
        start = time.thread_time()
        ready = next(batches)
        takes.append(time.thread_time() - start)
        for reads in (first, second):
            start = time.thread_time()
            buffer.copy_(ready["image"])
            reads.append(time.thread_time() - start)
    for name, values in (("take_ready_batch", takes), ("first_read_of_mapped_batch", first),
                         ("second_read_of_mapped_batch", second)):
        out[name] = round(1000 * statistics.median(values), 2)
    for _ in batches:
        pass
    out["image_mb"] = round(shared["image"].nbytes / 2**20, 1)
    out["label_mb"] = round(shared["label"].nbytes / 2**20, 1)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hippocampus", type=Path, default=HIPPOCAMPUS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs per configuration (after one warm-up)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides")
    parser.add_argument("--device-cache", action="store_true", help="also the device-resident path (on the CPU)")
    parser.add_argument("--stock", action="store_true", help="also PyTorch's own batches from one worker")
    parser.add_argument("--phases", action="store_true", help="time each step of a stock batch's crossing")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as a run does (build_run): freed batches' memory is reused, not faulted in again
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="mcseg-loader-") as tmp:
        cfg, cases = build_cases(args, Path(tmp))
        cfg.dataset.sampling.samples_per_epoch = args.batches * args.batch
        loaders = {}
        for workers in args.workers:
            cfg.dataset.sampling.num_workers, cfg.dataset.sampling.device_cache = workers, False
            loaders[f"workers={workers}"] = build_train_loader(cases, cfg.dataset, int(cfg.seed), device)
        if args.device_cache:
            cfg.dataset.sampling.num_workers, cfg.dataset.sampling.device_cache = 0, True
            loaders["device-resident"] = build_train_loader(cases, cfg.dataset, int(cfg.seed), device)
        if args.stock or args.phases:
            loader, sampler = loaders[f"workers={args.workers[-1]}"]
            loaders["stock workers=1"] = stock_loader(loader, sampler, 1), sampler
        record = {"command": "python scripts/bench_loader.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  "started": started, "cpus": os.cpu_count(), "case": "hippocampus 3D 48x64x48", "batch": args.batch, "batches": args.batches,
                  "threads": args.threads, "load_before": load(), "rates": {k: [] for k in loaders},
                  "cpu_ms_per_batch": {k: {"training process": [], "workers": []} for k in loaders}}
        for name, (loader, sampler) in loaders.items():  # warm-up: workers start, pages fault in
            loader_rate(loader, sampler, device, 0)
        for epoch in range(1, args.epochs + 1):
            for name, (loader, sampler) in loaders.items():
                rate, main_ms, workers_ms = timed_epoch(loader, sampler, device, epoch)
                record["rates"][name].append(round(rate, 1))
                record["cpu_ms_per_batch"][name]["training process"].append(round(main_ms, 1))
                record["cpu_ms_per_batch"][name]["workers"].append(round(workers_ms, 1))
        record["load_after"] = load()
        if args.phases:
            loader, sampler = loaders["stock workers=1"]
            record["phases_ms"] = crossing_phases(loader.dataset, args.batch, loader, sampler)
            record["load_after_phases"] = load()
        for loader, _ in loaders.values():
            stop_workers(loader)
    record["median"] = {k: statistics.median(v) for k, v in record["rates"].items()}
    record["cpu_ms_per_batch_median"] = {k: {who: statistics.median(v) for who, v in c.items()}
                                         for k, c in record["cpu_ms_per_batch"].items()}
    base = record["median"].get("workers=0")
    if base:
        record["ratio_to_in_process"] = {k: round(v / base, 3) for k, v in record["median"].items()}
    record["ended"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    record["environment"] = environment_record(device, False)
    print(json.dumps(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

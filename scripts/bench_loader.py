"""The training loader alone (no network): samples/s by who samples, side by side in one run, and where a
batch's crossing from a worker process goes.

    python scripts/bench_loader.py                      # 3D recipe, batch 32, workers 0 and 1, alternating
    python scripts/bench_loader.py --workers 0 1 2 --device-cache
    python scripts/bench_loader.py --phases             # also time each step of a batch's crossing

Each configuration runs ``--epochs`` epochs of ``--batches`` batches, the configurations alternating epoch by
epoch so that a busy machine's load hits them alike; the median and range are printed with the machine's load
(``os.getloadavg``) before and after. One torch thread unless ``--threads`` says otherwise. Output: one JSON
object (``--json`` also writes it to a file).
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

from benchmark import HIPPOCAMPUS, RECIPE_3D, compose  # noqa: E402

from mcseg.training.loader import build_train_loader, load_cases, stop_workers, to_device  # noqa: E402


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


def epoch_rate(loader, sampler, epoch: int, device: torch.device) -> float:
    """Samples/s of one epoch: every batch taken from the loader and brought to ``device`` (``to_device``)."""
    sampler.set_epoch(epoch)
    samples, start = 0, time.perf_counter()
    for batch in loader:
        image, _ = to_device(batch, device)
        samples += image.shape[0]
    return samples / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hippocampus", type=Path, default=HIPPOCAMPUS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs per configuration (after one warm-up)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="mcseg-loader-") as tmp:
        cfg, cases = build_cases(args, Path(tmp))
        cfg.dataset.sampling.samples_per_epoch = args.batches * args.batch
        loaders = {}
        for workers in args.workers:
            cfg.dataset.sampling.num_workers = workers
            loaders[f"workers={workers}"] = build_train_loader(cases, cfg.dataset, int(cfg.seed), device)
        record = {"case": "hippocampus 3D 48x64x48", "batch": args.batch, "batches": args.batches,
                  "threads": args.threads, "load_before": load(), "rates": {k: [] for k in loaders}}
        for name, (loader, sampler) in loaders.items():  # warm-up: workers start, pages fault in
            epoch_rate(loader, sampler, 0, device)
        for epoch in range(1, args.epochs + 1):
            for name, (loader, sampler) in loaders.items():
                record["rates"][name].append(round(epoch_rate(loader, sampler, epoch, device), 1))
        record["load_after"] = load()
        for loader, _ in loaders.values():
            stop_workers(loader)
    record["median"] = {k: statistics.median(v) for k, v in record["rates"].items()}
    base = record["median"].get("workers=0")
    if base:
        record["ratio_to_in_process"] = {k: round(v / base, 3) for k, v in record["median"].items()}
    print(json.dumps(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

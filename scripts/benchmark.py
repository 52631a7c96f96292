"""Training and evaluation throughput of mcseg on the current device, against the compute-only ceiling.

One run measures, on the device it runs on (CUDA when present, else the CPU):

(a) the compute-only ceiling: the configured network, loss and optimiser stepping on random
    tensors of the training batch's shape already on the device (plain PyTorch: zero_grad,
    forward under the configured autocast, loss, backward, optimiser step);
(b) mcseg's end-to-end training throughput on real data: the Trainer that ``mcseg.train.train``
    builds from the same config (``mcseg.training.build.build_run``, the construction before fitting) runs
    ``Trainer.train_epoch``, i.e. the full data path the run takes (cases in memory or memory-mapped,
    sampled and augmented in loader workers through the shared batch ring, or in process, or on the device
    with ``dataset.sampling.device_cache``; the record's ``training_batches``) and the full step (gradient
    clipping, non-finite tracking, loss read once per logging interval);
(c) the ratio b / a, for hippocampus 3D patches (the 3D recipe of docs/results.md) and 2D slices
    (the preset's default), (a) and (b) alternating;
(d) evaluation throughput: test volumes per second through ``evaluate_split``, the path of
    ``evaluate.py`` (loading, slice-wise or sliding-window inference, every metric, files);
and peak memory: host (the process's VmHWM per phase) and, on CUDA, GPU (``max_memory_allocated``).
A child process runs one FLARE-sized volume (512 x 512 x 300, 5 classes) through inference and
evaluation and reports its peak memory in copies of its probability tensor.

    python scripts/benchmark.py                    # full run: docs/benchmarks.json + docs/benchmarks.md
    python scripts/benchmark.py --short --no-write # a quick check that everything runs
    python scripts/benchmark.py --compile          # also with trainer.compile=true (compile time, steady rate)
    python scripts/benchmark.py --competitor 1     # each case quiet, then beside one competing torch process
    python scripts/benchmark.py eval-memory --shape 512 512 300 --classes 5   # one volume's peak memory, JSON

Results are kept per device kind in docs/benchmarks.json (a CPU run leaves the GPU entry alone
and vice versa); the Markdown section is rendered from that file (scripts/bench_report.py). The memory
helpers are scripts/bench_memory.py, the large volume's measurement scripts/bench_eval_memory.py.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_eval_memory import eval_memory_main, run_eval_memory_child  # noqa: E402
from bench_memory import peak_memory, synchronize  # noqa: E402
from bench_metrics import write_section  # noqa: E402
from bench_report import device_name, render  # noqa: E402
from competitor import competitors  # noqa: E402

from mcseg.config import EvalProtocol, InferenceConfig  # noqa: E402
from mcseg.training.build import build_run  # noqa: E402
from mcseg.training.trainer import Trainer  # noqa: E402
from mcseg.losses.base import target_checks  # noqa: E402
from mcseg.text import plural  # noqa: E402

JSON_PATH = ROOT / "docs" / "benchmarks.json"
DEFAULT_THREADS = torch.get_num_threads()
HIPPOCAMPUS = ROOT.parent / "shared" / "data" / "hippocampus"
SECTION = "Training throughput"
RECIPE_3D = ["loss=ce_dice", "dataset.sampling.dims=3", "dataset.sampling.patch_size=[48,64,48]",
             "dataset.sampling.batch_size=2"]
CASES = {  # name: (description, overrides after dataset=hippocampus)
    "hippocampus-3d": ("hippocampus 3D patches 48x64x48, batch 2, CE + Dice "
                       "(issue #2's CPU recipe, before the search of issue #15)", RECIPE_3D),
    "hippocampus-2d": ("hippocampus 2D slices 64x48, batch 32, CE (the preset's default)", []),
}


# ---------------------------------------------------------------- threads
def restore_threads() -> None:
    """Every case starts with the threads the process started with (mcseg's adaptation to a competitor
    in the previous case would otherwise carry over, and with it the loader workers it leaves room for)."""
    from mcseg import runtime

    if runtime._PROCESS_THREADS is not None:
        runtime._PROCESS_THREADS.restore()
    torch.set_num_threads(DEFAULT_THREADS)


# ---------------------------------------------------------------- the pieces mcseg builds
def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides)


# ---------------------------------------------------------------- (a), (b), (d)
def ceiling_rate(trainer: Trainer, steps: int, warmup: int) -> float:
    """(a): samples/s of the trainer's network, loss and optimiser on device-resident random tensors."""
    device = trainer.device
    batch = trainer.loader.batch_size
    sample = trainer.loader.dataset[0]
    image = torch.randn(batch, *sample["image"].shape, device=device)
    if trainer.channels_last:
        image = image.contiguous(memory_format=torch.channels_last if image.ndim == 4 else torch.channels_last_3d)
    label = torch.randint(0, trainer.num_classes, (batch, *sample["label"].shape), device=device)
    loss_fn, optimizer = trainer.loss_fn, trainer.optimizer
    trainer.train_module.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        trainer.forward_loss(image, label).backward()
        optimizer.step()

    adapted = torch.get_num_threads()  # plain PyTorch keeps the threads the process started with
    torch.set_num_threads(DEFAULT_THREADS)
    try:
        with target_checks(loss_fn, False):  # plain PyTorch checks nothing
            for _ in range(warmup):
                step()
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize(device)
    finally:
        torch.set_num_threads(adapted)
    return steps * batch / (time.perf_counter() - start)


def end_to_end_rate(trainer: Trainer, epoch: int) -> tuple[float, float]:
    """(b): samples/s of one ``Trainer.train_epoch`` (and its duration in seconds)."""
    trainer.step_in_epoch, trainer.epoch_loss_sum = 0, 0.0  # what Trainer.fit does between epochs
    samples = len(trainer.loader) * trainer.loader.batch_size
    start = time.perf_counter()
    trainer.train_epoch(epoch)
    synchronize(trainer.device)
    seconds = time.perf_counter() - start
    return samples / seconds, seconds


def loader_rate(loader, sampler, device: torch.device, epoch: int, channels_last: bool = False) -> float:
    """Samples/s of a training loader alone: one epoch of its batches brought to the device (``to_device``:
    pinned and copied, or already there), no network: what feeding can deliver, to set beside (a) and (b)."""
    from mcseg.training.loader import to_device

    sampler.set_epoch(epoch)
    samples, start = 0, time.perf_counter()
    for batch in loader:
        image, label = to_device(batch, device, channels_last)
        samples += image.shape[0]
    synchronize(device)
    return samples / (time.perf_counter() - start)


def loader_paths(trainer: Trainer, cfg, workers: list[int], epoch: int) -> dict:
    """The loader alone by path, on the trainer's cases: in the training process, each worker count of
    ``workers`` (through the shared batch ring) and device-resident (``dataset.sampling.device_cache=true``);
    each after one warm-up epoch (workers start, pages fault in)."""
    from omegaconf import open_dict

    from mcseg.training.loader import build_train_loader, stop_workers

    paths = {("in process" if n == 0 else plural(n, "worker")): {"num_workers": n, "device_cache": False}
             for n in workers}
    paths["device-resident"] = {"num_workers": 0, "device_cache": True}
    rates = {}
    for name, setting in paths.items():
        node = cfg.dataset.copy()
        with open_dict(node):
            node.sampling.update(setting)
        loader, sampler = build_train_loader(trainer.loader.dataset.cases, node, int(cfg.seed), trainer.device)
        loader_rate(loader, sampler, trainer.device, epoch, trainer.channels_last)
        rates[name] = round(loader_rate(loader, sampler, trainer.device, epoch + 1, trainer.channels_last), 2)
        stop_workers(loader)
        del loader
    return rates


def evaluation_rate(cfg, trainer: Trainer, n_cases: int, out_dir: Path) -> dict:
    """(d): test volumes/s through ``evaluate_split`` (after one untimed volume)."""
    from mcseg.config import typed
    from mcseg.data.build import build_dataset, resolve_split
    from mcseg.evaluation.split import evaluate_split

    dataset = build_dataset(cfg.dataset)
    refs = resolve_split(dataset, cfg.dataset, Path(cfg.paths.output_dir))["test"]
    protocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    inference = typed(cfg.inference, InferenceConfig, "inference")
    n_cases = min(n_cases, len(refs) - 1)

    def run(cases, where):
        return evaluate_split(trainer.predictor, dataset, cases, protocol, where, inference.save_predictions,
                              inference.save_probabilities)

    run(refs[:1], out_dir / "warmup")
    record = {"volumes": n_cases, "mean_voxels": None}
    with peak_memory(trainer.device, record):
        start = time.perf_counter()
        run(refs[1 : 1 + n_cases], out_dir / "timed")
        synchronize(trainer.device)
        seconds = time.perf_counter() - start
    record["volumes_per_s"] = round(n_cases / seconds, 2)
    record["mean_voxels"] = int(np.mean([np.prod(dataset.load(r).spatial_shape) for r in refs[1 : 1 + n_cases]]))
    return record


def bench_training_case(name: str, args, device: torch.device, compile_model: bool) -> dict:
    description, overrides = CASES[name]
    with tempfile.TemporaryDirectory(prefix="mcseg-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        cfg = compose(["dataset=hippocampus", f"dataset.root={args.hippocampus}", *overrides, *args.set,
                       f"trainer.device={device.type}", f"trainer.compile={str(compile_model).lower()}",
                       "trainer.progress_bar=false", "logger.images=0", f"paths.output_dir={run_dir}"])
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.dataset.sampling.samples_per_epoch = args.steps * int(cfg.dataset.sampling.batch_size)
        run = build_run(cfg)  # what train(cfg) builds before it fits: model, loss, optimiser, loader
        trainer = run.trainer
        workers = trainer.loader.num_workers
        record = {"case": name, "description": description, "overrides": overrides + args.set, "compile": compile_model,
                  "batch_size": trainer.loader.batch_size, "steps": args.steps, "loader_workers": workers,
                  "training_batches": trainer.loader.data_path}
        ceilings, rates = [], []
        with peak_memory(device, record):
            start = time.perf_counter()
            _, first_epoch_s = end_to_end_rate(trainer, 0)  # warm-up: workers start, compile, allocator
            record["first_epoch_s"] = round(first_epoch_s, 2)
            for repeat in range(args.repeats):  # alternate, so that load on a shared machine hits both alike
                ceilings.append(ceiling_rate(trainer, args.steps, args.warmup))
                rates.append(end_to_end_rate(trainer, repeat + 1)[0])
            record["loader_samples_per_s"] = round(loader_rate(trainer.loader, trainer.sampler, device,
                                                               args.repeats + 1, trainer.channels_last), 2)
            record["loader_paths"] = loader_paths(trainer, cfg, sorted({0, 1, workers}), args.repeats + 2)
            record["wall_s"] = round(time.perf_counter() - start, 1)
        record["ceiling_samples_per_s"] = round(statistics.median(ceilings), 2)
        record["end_to_end_samples_per_s"] = round(statistics.median(rates), 2)
        record["ratio"] = round(record["end_to_end_samples_per_s"] / record["ceiling_samples_per_s"], 3)
        record["runs"] = {"ceiling": [round(v, 2) for v in ceilings], "end_to_end": [round(v, 2) for v in rates]}
        if not compile_model:
            record["evaluation"] = evaluation_rate(cfg, trainer, args.eval_cases, Path(tmp) / "eval")
        print(json.dumps(record), flush=True)
        run.trackers.close()
        del trainer, run
        return record


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval-memory"]:
        return eval_memory_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="few steps and volumes, a smaller large volume")
    parser.add_argument("--steps", type=int, help="timed steps per measurement (default 60; 6 with --short)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed ceiling steps before each measurement")
    parser.add_argument("--repeats", type=int, help="alternating (a)/(b) repeats (default 3; 1 with --short)")
    parser.add_argument("--eval-cases", type=int, help="test volumes timed (default 30; 4 with --short)")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--compile", action="store_true", help="also measure with trainer.compile=true")
    parser.add_argument("--large-volume", type=int, nargs=3, help="default 512 512 300 (256 256 160 with --short)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra config overrides for every case, e.g. dataset.sampling.num_workers=0")
    parser.add_argument("--hippocampus", type=Path, default=HIPPOCAMPUS)
    parser.add_argument("--competitor", type=int, default=0, metavar="N",
                        help="measure each case again beside N competing torch processes (scripts/competitor.py)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    args.steps = args.steps or (6 if args.short else 60)
    args.repeats = args.repeats or (1 if args.short else 3)
    args.eval_cases = args.eval_cases or (4 if args.short else 30)
    large = args.large_volume or ([256, 256, 160] if args.short else [512, 512, 300])
    warnings.filterwarnings("ignore")
    import logging

    logging.basicConfig(level=logging.WARNING)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    entry = {"device": device_name(device), "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "mode": "short" if args.short else "full",
             "command": "python scripts/benchmark.py " + " ".join(argv), "training": []}
    print(entry["device"], flush=True)
    if not (args.hippocampus / "dataset.json").is_file():
        print(f"hippocampus data not found at {args.hippocampus} (give --hippocampus): training and evaluation "
              "throughput skipped", flush=True)
    else:
        for name in args.cases:
            restore_threads()
            record = bench_training_case(name, args, device, compile_model=False)
            if args.competitor:  # the same case again, in the same run, under load
                restore_threads()
                with competitors(args.competitor) as competition:
                    record["contended"] = bench_training_case(name, args, device, compile_model=False)
                record["competition"] = {**vars(competition), "description": competition.describe()}
                print(competition.describe(), flush=True)
            entry["training"].append(record)
            if args.compile:
                entry["training"].append(bench_training_case(name, args, device, compile_model=True))
    # --short: a smaller volume with small windows, so that the volume, not the windows, dominates
    roi, sw_batch = ([32, 32, 32], 2) if args.short and not args.large_volume else ([96, 96, 96], 4)
    entry["large_volume"] = run_eval_memory_child(large, 5, roi, sw_batch, device)
    print(json.dumps(entry["large_volume"]), flush=True)
    if args.no_write:
        return 0
    results = json.loads(JSON_PATH.read_text()) if JSON_PATH.is_file() else {}
    results[device.type] = entry
    JSON_PATH.write_text(json.dumps(results, indent=1) + "\n")
    write_section(render(results), SECTION)
    print(f"wrote {JSON_PATH} and the '{SECTION}' section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

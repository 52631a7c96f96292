"""The "Training throughput" section of docs/benchmarks.md, rendered from docs/benchmarks.json's per-device
results of scripts/benchmark.py, and the device's name as a result records it."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_metrics import machine  # noqa: E402


def loader_alone(record: dict) -> str:
    rate = record.get("loader_samples_per_s")
    return f" (alone {rate:.0f} samples/s)" if rate else ""


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (f"{props.name} ({props.total_memory / 2**30:.0f} GiB); torch {torch.__version__}, "
                f"CUDA {torch.version.cuda}")
    return machine()


def render(results: dict) -> str:
    """The Markdown section from the per-device results."""
    lines = [
        "`python scripts/benchmark.py` measures, in one run on the device it runs on, (a) the compute-only "
        "ceiling: the configured network, loss and optimiser stepping on random tensors of the training "
        "batch's shape already on the device (plain PyTorch); (b) mcseg end to end: the `Trainer` that "
        "`train(cfg)` builds runs `train_epoch` on the real data (the run's own data path: memory-mapped cases "
        "sampled and augmented in loader workers, or device-resident cases on CUDA, `dataset.sampling.device_cache`; "
        "non-blocking copies, gradient clipping, non-finite tracking, "
        "loss read once per logging interval); (c) b / a, (a) and (b) alternating, median of the repeats; "
        "(d) test volumes per second through `evaluate_split` (inference and every metric, predictions "
        "written); the loader workers' column adds what the loader alone delivers (its batches pinned and copied "
        "to the device, no network). Peak memory: the main process's resident set per phase (loader workers not included) and "
        "`torch.cuda.max_memory_allocated`.",
        "",
        "| device | case | (a) ceiling, samples/s | (b) mcseg, samples/s | b / a | loader workers "
        "| peak host / GPU MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in ("cpu", "cuda"):
        entry = results.get(kind)
        label = "CPU" if kind == "cpu" else "GPU"
        if not entry:
            lines.append(f"| {label} | - | not measured yet: `bash scripts/gpu_check.sh` on a GPU machine measures it | | | | |")
            continue
        for r in entry["training"]:
            gpu = f" / {r['peak_gpu_mb']:.0f}" if "peak_gpu_mb" in r else ""
            compiled = ", compiled" if r.get("compile") else ""
            lines.append(f"| {label} | {r['description']}{compiled} | {r['ceiling_samples_per_s']:.1f} | "
                         f"{r['end_to_end_samples_per_s']:.1f} | **{r['ratio']:.2f}** | {r['loader_workers']}"
                         f"{loader_alone(r)} | {r['peak_host_mb']:.0f}{gpu} |")
            c = r.get("contended")
            if c:
                slower = r["end_to_end_samples_per_s"] / c["end_to_end_samples_per_s"]
                lines.append(f"| {label} | the same, beside {r['competition']['n']} competing torch process(es): "
                             f"mcseg {slower:.1f}x slower than quiet | {c['ceiling_samples_per_s']:.1f} | "
                             f"{c['end_to_end_samples_per_s']:.1f} | **{c['ratio']:.2f}** | {c['loader_workers']} | "
                             f"{c['peak_host_mb']:.0f} |")
    lines += ["", "The loader alone by path (samples/s, its batches brought to the device, no network; one epoch after a "
              "warm-up one, in the same run as (a) and (b)): in the training process, from loader workers (through "
              "the shared batch ring), and device-resident (`dataset.sampling.device_cache=true`). The path a run "
              "takes is logged and kept in `result.json` (`device.training_batches`).", "",
              "| device | case | (a) ceiling | (b) mcseg | loader alone, by path |", "|---|---|---|---|---|"]
    for kind in ("cpu", "cuda"):
        for r in (results.get(kind) or {}).get("training", []):
            if r.get("loader_paths"):
                paths = ", ".join(f"{name} {rate:.0f}" for name, rate in r["loader_paths"].items())
                lines.append(f"| {'CPU' if kind == 'cpu' else 'GPU'} | {r['case']} | {r['ceiling_samples_per_s']:.1f} "
                             f"| {r['end_to_end_samples_per_s']:.1f} | {paths} |")
    lines += ["", "| device | evaluation | volumes/s | peak host / GPU MB |", "|---|---|---|---|"]
    for kind in ("cpu", "cuda"):
        entry = results.get(kind)
        if not entry:
            lines.append("| GPU | - | not measured yet: `bash scripts/gpu_check.sh` on a GPU machine measures it | |")
            continue
        for r in entry["training"]:
            e = r.get("evaluation")
            if e:
                gpu = f" / {e['peak_gpu_mb']:.0f}" if "peak_gpu_mb" in e else ""
                lines.append(f"| {'CPU' if kind == 'cpu' else 'GPU'} | {r['case']}: {e['volumes']} test volumes, "
                             f"{e['mean_voxels'] / 1e3:.0f}k voxels on average | {e['volumes_per_s']:.2f} | "
                             f"{e['peak_host_mb']:.0f}{gpu} |")
                ce = (r.get("contended") or {}).get("evaluation")
                if ce:
                    lines.append(f"| {'CPU' if kind == 'cpu' else 'GPU'} | the same, beside "
                                 f"{r['competition']['n']} competing torch process(es): "
                                 f"{e['volumes_per_s'] / ce['volumes_per_s']:.1f}x slower than quiet | "
                                 f"{ce['volumes_per_s']:.2f} | {ce['peak_host_mb']:.0f} |")
    lines += ["", "Large volume: one case through sliding-window inference (a stand-in network whose working "
              "memory is its window batch), softmax and every metric (`python scripts/benchmark.py eval-memory`); "
              "peak memory above what the process held before, in copies of the case's probability tensor "
              "(K x S float32). Two is the floor of the design: logits and probabilities coexist while one is "
              "converted into the other, and the logits are released before the metrics run.", "",
              "| device | volume | classes | window, sw batch | probability tensor MB | peak extra MB | copies "
              "| seconds |",
              "|---|---|---|---|---|---|---|---|"]
    for kind in ("cpu", "cuda"):
        m = (results.get(kind) or {}).get("large_volume")
        if m:
            lines.append(f"| {'CPU' if kind == 'cpu' else 'GPU'} | {' x '.join(map(str, m['shape']))} | "
                         f"{m['classes']} | {' x '.join(map(str, m['roi_size']))}, {m['sw_batch_size']} | "
                         f"{m['probability_tensor_mb']:.0f} | {m['peak_extra_mb']:.0f} | "
                         f"**{m['copies_of_probability_tensor']:.2f}** | {m['seconds']:.0f} |")
    lines.append("")
    for kind in ("cpu", "cuda"):
        for r in (results.get(kind) or {}).get("training", []):
            if r.get("competition"):
                lines.append(f"Competitors of {r['case']}: {r['competition']['description']}.")
                lines.append("")
    for kind in ("cpu", "cuda"):
        entry = results.get(kind)
        if entry:
            lines.append(f"{'CPU' if kind == 'cpu' else 'GPU'} run ({entry['measured']}, {entry['mode']} mode, "
                         f"`{entry['command']}`): {entry['device']}.")
            lines.append("")
    return "\n".join(lines)

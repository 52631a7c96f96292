"""Benchmark mcseg's per-case evaluation against MONAI + torchmetrics on the same inputs (CPU).

For each case, from the same probabilities (C x *spatial, float32) and label map:

* mcseg: ``Evaluator.add_case`` with region ``all`` (the voxels MONAI and torchmetrics use):
  Dice, HD95 and ASSD per class, ECE, MCE, classwise ECE (and each class's term), adaptive ECE,
  NLL, Brier;
* reference: argmax and one-hot encoding (what the libraries need as input), MONAI
  ``HausdorffDistanceMetric`` (HD95 per class, spacing) and ``CalibrationErrorMetric`` (ECE per
  class), torchmetrics ``MulticlassCalibrationError`` (top-label ECE and MCE, two metrics).

mcseg computes a superset of the reference's numbers; the shared ones are compared, and both
sides are also compared with an exact float64 NumPy computation of the calibration errors.
Runs alternate between the two pipelines and the median over repeats is reported.

    python scripts/bench_metrics.py                # writes the "Metrics" section of docs/benchmarks.md
    python scripts/bench_metrics.py --no-write --repeats 1 --hippocampus-cases 10
    python scripts/bench_metrics.py --competitor 1   # also beside one competing torch process (quiet and contended)
    python scripts/bench_metrics.py --no-write --json out.json   # the raw times of every run, to commit beside a row
    MCSEG_ADAPTIVE_THREADS=0 python scripts/bench_metrics.py --competitor 1 --no-write   # without mcseg's thread adaptation
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from competitor import competitors  # noqa: E402

from mcseg.environment import environment_record  # noqa: E402
from mcseg.evaluation.evaluator import Evaluator  # noqa: E402
from mcseg.config import EvalProtocol  # noqa: E402
from mcseg.runtime import share_cpu  # noqa: E402

N_BINS = 15
DEFAULT_THREADS = torch.get_num_threads()
DOC = ROOT / "docs" / "benchmarks.md"


def synthetic_probs(label: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """Probabilities that mostly agree with ``label``: a blurred one-hot plus smooth noise."""
    g = torch.Generator().manual_seed(seed)
    onehot = F.one_hot(label, k).movedim(-1, 0).float()[None]
    pool = F.avg_pool3d if label.ndim == 3 else F.avg_pool2d
    soft = pool(onehot, 5, stride=1, padding=2)[0]
    coarse = [max(n // 16, 2) for n in label.shape]
    mode = "trilinear" if label.ndim == 3 else "bilinear"
    noise = F.interpolate(torch.randn(1, k, *coarse, generator=g), size=tuple(label.shape), mode=mode)[0]
    return torch.softmax(8 * soft + 2.5 * noise, 0)


def synthetic_ct(shape=(256, 256, 160), k: int = 14, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A CT-sized label map of k - 1 random ellipsoids (organs) and matching probabilities."""
    g = torch.Generator().manual_seed(seed)
    axes = torch.meshgrid(*[torch.arange(n, dtype=torch.float32) for n in shape], indexing="ij")
    label = torch.zeros(shape, dtype=torch.int64)
    for c in range(1, k):
        centre = [float(torch.empty(1).uniform_(0.2 * n, 0.8 * n, generator=g)) for n in shape]
        radius = [float(torch.empty(1).uniform_(0.06 * n, 0.2 * n, generator=g)) for n in shape]
        label[sum(((x - c0) / r) ** 2 for x, c0, r in zip(axes, centre, radius)) <= 1] = c
    return synthetic_probs(label, k, seed), label


def run_mcseg(probs, label, spacing, k):
    share_cpu("cpu")  # as mcseg's evaluation does before each case: its threads follow the CPU it gets
    ev = Evaluator(k, [f"class_{i}" for i in range(k)], EvalProtocol(region="all", n_bins=N_BINS,
                                                                     bootstrap_samples=0))
    flat = ev.add_case("case", probs, label, spacing)
    case = ev._cases[0]
    return {"hd95": np.array(case["hd95_mm"][1:]), "class_ece": np.array(case["class_ece"]),
            "ece": flat["ece"], "mce": flat["mce"]}


def run_reference(probs, label, spacing, k):
    """The plain alternative, with torch's threads as the process started (mcseg's adaptation, which
    alternating runs in this process share, is undone for it and restored afterwards)."""
    adapted = torch.get_num_threads()
    torch.set_num_threads(DEFAULT_THREADS)
    try:
        return _reference(probs, label, spacing, k)
    finally:
        torch.set_num_threads(adapted)


def _reference(probs, label, spacing, k):
    from monai.metrics import CalibrationErrorMetric, HausdorffDistanceMetric
    from torchmetrics.classification import MulticlassCalibrationError

    def onehot(t):
        return F.one_hot(t, k).movedim(-1, 0)[None].float()

    pred_oh, label_oh = onehot(probs.argmax(0)), onehot(label)
    hd = HausdorffDistanceMetric(include_background=False, percentile=95, reduction="none")(
        pred_oh, label_oh, spacing=list(spacing))
    class_ece = CalibrationErrorMetric(num_bins=N_BINS, metric_reduction="none")(probs[None], label_oh)
    top = {}
    for norm in ("l1", "max"):
        metric = MulticlassCalibrationError(k, n_bins=N_BINS, norm=norm)
        metric.update(probs[None], label[None])
        top[norm] = float(metric.compute())
    return {"hd95": hd[0].numpy().astype(np.float64), "class_ece": class_ece[0].numpy().astype(np.float64),
            "ece": top["l1"], "mce": top["max"]}


def exact_calibration(probs, label, k):
    """Float64 NumPy reference: per-class ECE, top-label ECE and MCE, bins (lo, hi]."""
    p = probs.reshape(k, -1).numpy()
    y = label.reshape(-1).numpy()

    def ece(values, hits):
        bins = np.clip(np.ceil(values.astype(np.float64) * N_BINS) - 1, 0, N_BINS - 1).astype(np.int64)
        n = np.bincount(bins, minlength=N_BINS)
        gap = np.abs(np.bincount(bins, hits.astype(np.float64), N_BINS) - np.bincount(bins, values, N_BINS))
        return gap.sum() / len(values), (gap[n > 0] / n[n > 0]).max()

    conf, pred = p.max(0), p.argmax(0)
    top_ece, top_mce = ece(conf, pred == y)
    return {"class_ece": np.array([ece(p[c], y == c)[0] for c in range(k)]), "ece": top_ece, "mce": top_mce}


def timed(fn, *args):
    """Wall seconds, CPU seconds of this process (``time.process_time``: on a busy machine the wall time also
    counts the others' turns), and the result."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return time.perf_counter() - start, time.process_time() - cpu, out


def compare(ours: dict, theirs: dict, exact: dict | None) -> dict:
    both = ~np.isnan(ours["hd95"]) & ~np.isnan(theirs["hd95"])
    out = {"hd95_rel": float(np.max(np.abs(ours["hd95"][both] - theirs["hd95"][both]) / theirs["hd95"][both]))
           if both.any() else float("nan"),
           "class_ece": float(np.max(np.abs(ours["class_ece"] - theirs["class_ece"]))),
           "ece": abs(ours["ece"] - theirs["ece"]), "mce": abs(ours["mce"] - theirs["mce"])}
    if exact is not None:
        for side, values in (("mcseg", ours), ("reference", theirs)):
            out[f"{side}_vs_exact"] = max(float(np.max(np.abs(values["class_ece"] - exact["class_ece"]))),
                                          abs(values["ece"] - exact["ece"]), abs(values["mce"] - exact["mce"]))
    return out


def machine() -> str:
    cpu = "unknown CPU"
    if Path("/proc/cpuinfo").is_file():
        names = re.findall(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = names[0].strip() if names else cpu
    mem = ""
    if Path("/proc/meminfo").is_file():
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f", {kb / 2**20:.0f} GiB RAM"
    load = f", load average {os.getloadavg()[0]:.1f} at start" if hasattr(os, "getloadavg") else ""
    import monai
    import scipy
    import torchmetrics

    return (f"{cpu}, {os.cpu_count()} logical CPUs{mem} ({platform.system()}, virtual machine{load}); "
            f"torch {torch.__version__} with {torch.get_num_threads()} threads (mcseg's adaptive threads "
            f"{'off' if os.environ.get('MCSEG_ADAPTIVE_THREADS') == '0' else 'on'}), MONAI {monai.__version__}, "
            f"torchmetrics {torchmetrics.__version__}, scipy {scipy.__version__}, Python {platform.python_version()}")


def bench_case(probs, label, spacing, k, repeats, exact=True, warmup=True):
    if warmup:  # first touches of fresh memory are slow on a virtual machine: warm both up, untimed
        run_mcseg(probs, label, spacing, k), run_reference(probs, label, spacing, k)
    ours_t, ref_t, cpu = [], [], {"mcseg": [], "reference": []}
    for _ in range(repeats):  # alternate, so that load on a shared machine hits both alike
        t, c, ours = timed(run_mcseg, probs, label, spacing, k)
        ours_t.append(t)
        cpu["mcseg"].append(c)
        t, c, theirs = timed(run_reference, probs, label, spacing, k)
        ref_t.append(t)
        cpu["reference"].append(c)
    return ours_t, ref_t, compare(ours, theirs, exact_calibration(probs, label, k) if exact else None), cpu


def hippocampus_cases(root: Path, n: int):
    import nibabel as nib

    for path in sorted((root / "labelsTr").glob("hippocampus_*.nii.gz"))[:n]:
        img = nib.load(str(path))
        label = torch.from_numpy(np.asarray(img.dataobj).astype(np.int64))
        yield path.name, label, tuple(float(z) for z in img.header.get_zooms()[:3])


def write_section(text: str, title: str = "Metrics") -> None:
    """Replace (or append) the ``## <title>`` section of docs/benchmarks.md, leaving the others."""
    doc = DOC.read_text() if DOC.is_file() else "# Benchmarks\n"
    section = f"## {title}\n\n" + text.strip() + "\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    doc = pattern.sub(lambda _: section + "\n", doc) if pattern.search(doc) else doc.rstrip() + "\n\n" + section
    DOC.parent.mkdir(parents=True, exist_ok=True)
    tmp = DOC.with_name(f".{DOC.name}.tmp")
    tmp.write_text(doc.rstrip() + "\n")
    os.replace(tmp, DOC)


def measure(args) -> dict:
    """Times of the CT-sized case and the hippocampus cases, and the agreement of the two pipelines."""
    k, shape, spacing = 14, (256, 256, 160), (0.8, 0.8, 2.5)
    probs, label = synthetic_ct(shape, k)
    ours_t, ref_t, diff, cpu = bench_case(probs, label, spacing, k, args.repeats)
    result = {"ct": (statistics.median(ours_t), statistics.median(ref_t)), "diff": diff,
              "spread": f"mcseg {min(ours_t):.2f}-{max(ours_t):.2f} s, reference {min(ref_t):.2f}-{max(ref_t):.2f} s",
              "hip": None, "runs_s": {"mcseg": ours_t, "reference": ref_t}, "runs_cpu_s": cpu,
              "ct_cpu": (statistics.median(cpu["mcseg"]), statistics.median(cpu["reference"]))}
    ct, ct_cpu = result["ct"], result["ct_cpu"]
    print(f"CT-sized: mcseg {ct[0]:.2f} s, MONAI + torchmetrics {ct[1]:.2f} s, ratio {ct[1] / ct[0]:.1f}; CPU "
          f"{ct_cpu[0]:.2f} s and {ct_cpu[1]:.2f} s, ratio {ct_cpu[1] / ct_cpu[0]:.1f}; {diff}", flush=True)
    del probs
    if (args.hippocampus / "labelsTr").is_dir():
        totals, cpu_totals, diffs, n, n_vox = [0.0, 0.0], [0.0, 0.0], [], 0, 0
        for i, (name, lab, sp) in enumerate(hippocampus_cases(args.hippocampus, args.hippocampus_cases)):
            p = synthetic_probs(lab, 3, seed=i)
            o, r, d, c = bench_case(p, lab, sp, 3, 1, exact=True, warmup=i == 0)
            totals[0] += o[0]
            totals[1] += r[0]
            cpu_totals[0] += c["mcseg"][0]
            cpu_totals[1] += c["reference"][0]
            diffs.append(d)
            n += 1
            n_vox += lab.numel()
        worst = {key: max(d[key] for d in diffs) for key in diffs[0]}
        result["hip"] = (n, n_vox / n, totals, worst)
        result["hip_cpu"] = cpu_totals
        print(f"hippocampus ({n} cases): mcseg {totals[0]:.2f} s, reference {totals[1]:.2f} s, "
              f"ratio {totals[1] / totals[0]:.1f}; CPU {cpu_totals[0]:.2f} s and {cpu_totals[1]:.2f} s, ratio "
              f"{cpu_totals[1] / cpu_totals[0]:.1f}; {worst}", flush=True)
    else:  # said, not skipped in silence: a worktree's default path (../shared) may not exist
        print(f"hippocampus skipped: no labelsTr in {args.hippocampus} (--hippocampus DIR: the MSD Task04 folder)",
              file=sys.stderr, flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hippocampus", type=Path, default=ROOT.parent / "shared" / "data" / "hippocampus")
    parser.add_argument("--hippocampus-cases", type=int, default=40)
    parser.add_argument("--competitor", type=int, default=0, metavar="N",
                        help="also measure beside N competing torch processes (scripts/competitor.py)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the raw measurements (every run's seconds, the "
                        "machine, its load average before and after) to this file")
    args = parser.parse_args(argv)
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.getloadavg()
    warnings.filterwarnings("ignore")  # MONAI deprecation and empty-class warnings
    desc = machine()
    print(desc)
    quiet = measure(args)
    busy, competition = None, None
    if args.competitor:
        print(f"again beside {args.competitor} competing process(es)", flush=True)
        with competitors(args.competitor) as competition:
            busy = measure(args)
        print(competition.describe())
    ct, diff, spread, hip = quiet["ct"], quiet["diff"], quiet["spread"], quiet["hip"]
    if args.json:
        args.json.write_text(json.dumps({
            "command": "python scripts/bench_metrics.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": desc, "started": started, "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()], "torch_threads": torch.get_num_threads(),
            "quiet": quiet, "contended": busy, "competitors": competition.describe() if busy else None,
            "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "environment": environment_record("cpu", False)},
            indent=1, default=float) + "\n")

    if args.no_write:
        return 0
    lines = [
        "`python scripts/bench_metrics.py` — mcseg's full per-case evaluation (`Evaluator.add_case`, region "
        "`all`: Dice, HD95 and ASSD per class, ECE, MCE, classwise ECE, adaptive ECE, NLL, Brier) against "
        "MONAI `HausdorffDistanceMetric` (HD95, spacing) + `CalibrationErrorMetric` (ECE per class) + "
        "torchmetrics `MulticlassCalibrationError` (top-label ECE and MCE), from the same float32 "
        "probabilities and label map. The reference time includes the argmax and one-hot encoding those "
        "metrics need as input. Both pipelines are run once untimed first (on this virtual machine the first "
        "touch of fresh memory costs several times the computation), then alternately; median of the runs.",
        "",
        f"Machine: {desc}. Quiet: nothing else running. "
        + (f"Contended: the same measurements again, in the same run, beside {competition.describe()}; "
           "the last column is mcseg's contended time over its quiet time (the fair share of the CPU "
           "predicts about 2x for one competitor using every core)."
           if busy else "Run with `--competitor 1` to add the figures under load."),
        "",
        "| inputs | mcseg | MONAI + torchmetrics | speed-up |"
        + (" mcseg, contended | MONAI + torchmetrics, contended | speed-up, contended | mcseg contended / quiet |"
           if busy else ""),
        "|---|---|---|---|" + ("---|---|---|---|" if busy else ""),
    ]

    def row(name: str, key: str) -> str:
        def times(result):
            if key == "ct":
                return result["ct"]
            return tuple(result["hip"][2]) if result["hip"] else None
        quiet_t = times(quiet)
        cells = [name, f"{quiet_t[0]:.2f} s", f"{quiet_t[1]:.2f} s", f"**{quiet_t[1] / quiet_t[0]:.1f}x**"]
        if busy:
            busy_t = times(busy)
            cells += [f"{busy_t[0]:.2f} s", f"{busy_t[1]:.2f} s", f"**{busy_t[1] / busy_t[0]:.1f}x**",
                      f"{busy_t[0] / quiet_t[0]:.1f}x"]
        return "| " + " | ".join(cells) + " |"

    lines.append(row(f"synthetic CT, 256 x 256 x 160, 14 classes, spacing 0.8 x 0.8 x 2.5 mm (median of "
                     f"{args.repeats} runs; quiet {spread})", "ct"))
    if hip is not None:
        n, mean_vox, totals, worst = hip
        lines.append(row(f"hippocampus (MSD Task04 labels, {n} cases, {mean_vox / 1e3:.0f}k voxels on average, "
                         f"3 classes, synthetic probabilities), total", "hip"))
    lines += [
        "",
        "Agreement on the shared numbers (largest difference over classes and cases):",
        "",
        "| quantity | synthetic CT | hippocampus |",
        "|---|---|---|",
    ]
    hip_d = hip[3] if hip is not None else {}

    def cell(d, key, fmt="{:.1e}"):
        return fmt.format(d[key]) if key in d else "-"

    lines += [
        f"| HD95, relative difference mcseg vs MONAI | {cell(diff, 'hd95_rel')} | {cell(hip_d, 'hd95_rel')} |",
        f"| ECE per class, mcseg vs MONAI | {cell(diff, 'class_ece')} | {cell(hip_d, 'class_ece')} |",
        f"| top-label ECE, mcseg vs torchmetrics | {cell(diff, 'ece')} | {cell(hip_d, 'ece')} |",
        f"| top-label MCE, mcseg vs torchmetrics | {cell(diff, 'mce')} | {cell(hip_d, 'mce')} |",
        f"| calibration errors, mcseg vs exact float64 | {cell(diff, 'mcseg_vs_exact')} | "
        f"{cell(hip_d, 'mcseg_vs_exact')} |",
        f"| calibration errors, MONAI/torchmetrics vs exact float64 | {cell(diff, 'reference_vs_exact')} | "
        f"{cell(hip_d, 'reference_vs_exact')} |",
        "",
        "Where mcseg and the libraries differ on calibration, the libraries are the ones off: both "
        "accumulate per-bin sums in float32 with `scatter_add` (torchmetrics even for float64 inputs), and "
        "adding many nearly equal confidences to a large float32 sum rounds the same way each time, so the "
        "error grows with the bin's size (2e-4 on 65k voxels, 1e-2 on 10M); mcseg accumulates in float64 "
        "and agrees with an exact float64 computation. HD95 differs only by MONAI's float32 distances. "
        "Why mcseg is faster: one boundary pass over the label map for all classes (MONAI crops and "
        "erodes once per class on one-hot volumes), class probabilities binned in cache-sized chunks "
        "with the dominant bin 0 taken as a complement, and no one-hot encoding; on small cases, the smooth "
        "ECE's bandwidth search shares its FFTs and freed memory is reused instead of faulted in again.",
    ]
    write_section("\n".join(lines))
    print(f"wrote the Metrics section of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

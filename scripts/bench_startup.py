"""Start-up of every entry point against ``import torch`` (docs/benchmarks.md, "Start-up"; issue #58).

Each measurement is a fresh interpreter (``python -c "import <module>"``: what a console script pays before its
command runs), timed from outside, ``--repeats`` rounds, each round running ``import torch``, every entry point and
the refusal of a bad key (``python train.py optim.lr=abc``: Hydra composes, the config checks refuse, exit 1) one
after the other, so that the machine's load changes touch them alike. Reports the median of each and its ratio to
the median of ``import torch``, the target being <= 1.5x (issue #58, "Done when"); a busy machine makes the seconds
vary more than the ratios. A second table gives the CPU seconds (user + system) of the same runs, which other
processes on a busy machine change far less than the wall seconds. ``--baseline ROOT`` also times each entry point
from another checkout (e.g. an export of main) right after this one's, in the same round: a before/after whose pairs
meet the same load.
``python scripts/bench_startup.py [--repeats 5] [--baseline ROOT] [--json out.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name shown: the module its console script or Hydra entry point imports before the command runs
ENTRY_POINTS = {
    "train.py / evaluate.py / mcseg-train (mcseg.cli)": "mcseg.cli",
    "mcseg-evaluate-folder": "mcseg.evaluate_folder",
    "mcseg-calibrate-folder": "mcseg.calibrate_folder",
    "mcseg-conformal-folder": "mcseg.conformal_folder",
    "mcseg-new-cases": "mcseg.new_cases",
    "mcseg-dicom": "mcseg.dicom_export",
    "mcseg-report": "mcseg.report.cli",
    "mcseg-sweep": "mcseg.submitted",
    "mcseg-data": "mcseg.data.check",
    "sweep callbacks (mcseg.sweep)": "mcseg.sweep",
    "evaluate() itself (mcseg.evaluate)": "mcseg.evaluate",
    "train() itself (mcseg.train)": "mcseg.train",
    # not an entry point: what any command that predicts a volume or builds a MONAI network pays on top of torch,
    # since importing any MONAI module runs monai/__init__.py, which imports every submodule (MONAI 1.6 has no
    # setting to skip that)
    "import monai.inferers (any MONAI module)": "monai.inferers",
}
REFUSAL = "train.py optim.lr=abc (refused)"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CPU: dict[str, list[float]] = {}  # name -> CPU seconds (user + system) of each of its runs


def timed(command: list[str], env: dict, expect: int = 0, name: str = "") -> float:
    """Wall seconds of ``command``; its CPU seconds (user + system, which another process's load barely changes)
    are kept in :data:`CPU` under ``name``."""
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, cwd=env["PYTHONPATH"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    CPU.setdefault(name, []).append(_children_cpu() - cpu)
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}, expected {expect}\n{done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code is timed (e.g. an export of "
                        "an earlier commit, for a before/after in the same session)")
    parser.add_argument("--baseline", type=Path, help="also time each entry point from this checkout, right after "
                        "the same one from --root (rows marked [baseline])")
    parser.add_argument("--only", nargs="*", help="time only these entry points (names or modules of the table)")
    parser.add_argument("--json", type=Path, help="also write the raw times, the load before and after each "
                        "round, the command and the code commit here (the raw output beside docs/benchmarks.md)")
    args = parser.parse_args()
    root = args.root.resolve()
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    env.pop("MCSEG_TRACEBACK", None)
    roots = {"": (root, env)}
    if args.baseline:
        roots[" [baseline]"] = (args.baseline.resolve(), {**env, "PYTHONPATH": str(args.baseline.resolve())})
    record = {"command": " ".join(sys.argv), "root": str(root), "commit": commit, "cpus": os.cpu_count(),
              "baseline": str(args.baseline.resolve()) if args.baseline else None,
              "python": sys.version.split()[0],
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loads": [], "seconds": {}}
    entry_points = {name: module for name, module in ENTRY_POINTS.items()
                    if args.only is None or name in args.only or module in args.only}
    names = ["import torch", *(name + mark for name in [*entry_points, REFUSAL] for mark in roots)]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            record["loads"].append(os.getloadavg()[0])
            seconds["import torch"].append(timed([sys.executable, "-c", "import torch"], env,
                                                   name="import torch"))
            for name, module in entry_points.items():
                for mark, (_, where) in roots.items():
                    seconds[name + mark].append(timed([sys.executable, "-c", f"import {module}"], where,
                                                              name=name + mark))
            for mark, (checkout, where) in roots.items():
                seconds[REFUSAL + mark].append(timed([sys.executable, str(checkout / "train.py"), "optim.lr=abc",
                                                      f"hydra.run.dir={Path(tmp) / f'refused{r}{len(mark)}'}"],
                                                     where, expect=1, name=REFUSAL + mark))
            print(f"round {r + 1}/{args.repeats}: load {record['loads'][-1]:.1f}, import torch "
                  f"{seconds['import torch'][-1]:.1f} s", file=sys.stderr)
    record["loads"].append(os.getloadavg()[0])
    record["seconds"], record["cpu_seconds"] = seconds, CPU
    print(f"load average (1 min) over the rounds: {min(record['loads']):.1f} to {max(record['loads']):.1f} on "
          f"{os.cpu_count()} CPUs; {args.repeats} rounds, medians")
    for what, times in (("wall", seconds), ("CPU (user + system)", CPU)):
        floor = statistics.median(times["import torch"])
        print(f"| what | median {what} s | min-max s | x import torch | <= 1.5x |")
        print("|---|---|---|---|---|")
        for name in names:
            median = statistics.median(times[name])
            print(f"| {name} | {median:.2f} | {min(times[name]):.2f}-{max(times[name]):.2f} | {median / floor:.2f} | "
                  f"{'yes' if median <= 1.5 * floor else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

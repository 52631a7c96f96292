"""The folder evaluation against nnU-Net's evaluator on the same cases, side by side in one run (#58 item 6).

    python scripts/bench_folder_eval.py PRED_DIR REFERENCE_LABELS --nnunet-python /work/runs/nnunet/venv/bin/python \\
        --workers 2 --repeats 3 -o docs/results/folder_eval_bench.json

Each round times, as a user waits for it (the whole command, imports included, wall clock), in a rotating order:

* ``mcseg-evaluate-folder PRED_DIR REFERENCE`` with every figure (Dice, HD95, ASSD, every calibration figure,
  failure detection, both PNG figures), ``--workers 1`` and ``--workers N``;
* the same evaluation in a process that imported mcseg before its clock starts (``inner_s``: what the workers
  can speed up), ``workers`` 1 and N;
* nnU-Net v2's ``compute_metrics_on_folder`` (Dice, IoU and counts from the label maps only; run with the python
  of nnU-Net's own environment) with ``num_processes=1`` and ``N``, on a folder of links to the same label maps.

``--scaling-only`` times instead, after the imports, ``--workers 1`` and ``N`` against the plain alternative: the
folder split by hand into N parts (nnU-Net's ``splits_final.json``, one fold a part) evaluated side by side by N
processes with one worker each, and one part alone (how much N processes slow each other on this machine).

The load average before and after each command goes into the JSON, with the machine's CPU count: on a shared
machine a ratio measured side by side holds better than an absolute time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# mcseg's evaluation after its imports: the per-case reading and scoring and the writing (figures included)
INNER = r"""
import json, sys, time
from pathlib import Path
from mcseg.evaluate_folder import evaluate_folder
start = time.perf_counter()
evaluate_folder(Path(sys.argv[1]), Path(sys.argv[2]), output_dir=Path(sys.argv[3]), allow_missing=True,
                overwrite=True, workers=int(sys.argv[4]))
print(json.dumps({"inner_s": round(time.perf_counter() - start, 2)}))
"""

# workers 1 and N alternately in one process that imported mcseg once: the scaling of the evaluation itself, each
# timing beside the others under the same load; per timing also the CPU seconds of the process and its workers.
# Two more arms, the plain alternative to --workers N: the folder split by hand into N parts (nnU-Net's
# splits_final.json, one fold a part) and N forked processes evaluating one part each with one worker, started
# together ("split"); and the first part evaluated alone ("part_alone": the split's parts slow each other by the
# ratio of the two on this machine)
SCALING = r"""
import json, os, sys, time
from pathlib import Path
from mcseg.evaluate_folder import evaluate_folder
pred, ref, scratch, n, rounds, splits = (Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]),
                                         int(sys.argv[5]), Path(sys.argv[6]))
def whole(workers):
    evaluate_folder(pred, ref, output_dir=scratch / f"w{workers}" / "eval", allow_missing=True, overwrite=True,
                    workers=workers)
def parts(folds):
    pids = []
    for k in folds:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                evaluate_folder(pred, ref, output_dir=scratch / f"part{k}" / "eval", allow_missing=True,
                                overwrite=True, splits=splits, fold=str(k), workers=1)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        if os.waitpid(pid, 0)[1] != 0:
            raise SystemExit(f"a part's evaluation failed (process {pid})")
# each arm: what it runs and how many processes score the cases
arms = {"workers1": (lambda: whole(1), 1), f"workers{n}": (lambda: whole(n), n), "split": (lambda: parts(range(n)), n),
        "part_alone": (lambda: parts([0]), 1)}
names = list(arms)
runs = []
for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:  # a rotating order
        start, cpu = time.perf_counter(), os.times()
        run, processes = arms[name]
        run()
        end = os.times()
        runs.append({"arm": name, "round": r, "workers": processes, "inner_s": round(time.perf_counter() - start, 2),
                     "load": os.getloadavg()[0], "cpu_s": round(sum(end[:4]) - sum(cpu[:4]), 2)})
        print(runs[-1], file=sys.stderr, flush=True)
print(json.dumps({"scaling": runs}))
"""

NNUNET = r"""
import sys
from nnunetv2.evaluation.evaluate_predictions import compute_metrics_on_folder
from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
ref, pred, out, labels, n = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4]), int(sys.argv[5])
compute_metrics_on_folder(ref, pred, out, SimpleITKIO(), ".nii.gz", labels, num_processes=n)
"""


def _timed(cmd: list[str], env: dict) -> dict:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} ...: exit {done.returncode}\n{done.stderr[-2000:]}")
    out = {"wall_s": round(wall, 2), "load_before": load, "load_after": os.getloadavg()[0]}
    last = done.stdout.strip().splitlines()[-1:] or [""]
    return {**out, **json.loads(last[0])} if last[0].startswith('{"inner_s"') else out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pred_dir", type=Path, help="mcseg's predictions (<case>.nii.gz label maps, <case>_probs.nii.gz)")
    p.add_argument("labels", type=Path, help="the reference label folder (e.g. an MSD task's labelsTr)")
    p.add_argument("--reference", type=Path, help="what mcseg-evaluate-folder takes as reference (default: labels)")
    p.add_argument("--nnunet-python", required=True, help="the python of an environment with nnunetv2")
    p.add_argument("--classes", type=int, default=3, help="K, background included (nnU-Net scores 1..K-1)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scaling-only", action="store_true", help="only the scaling, after the imports, in one "
                   "process (--repeats rounds, a rotating order): workers 1 and N, the folder split by hand into N "
                   "parts evaluated side by side by N processes, and one part alone")
    p.add_argument("--copies", type=int, default=1, help="evaluate a folder of links holding each case this many "
                   "times under new names (case_0000, ...; its label linked beside): a thousand cases from 31")
    p.add_argument("--dataset-json", type=Path, help="with --copies: the dataset.json that names the classes")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args(argv)
    if args.scaling_only:
        return _scaling(args)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    scratch = Path(tempfile.mkdtemp(prefix="bench_folder_eval_"))
    maps = scratch / "label_maps"
    maps.mkdir()
    cases = sorted(f.name for f in args.pred_dir.glob("*.nii.gz") if not f.name.endswith("_probs.nii.gz"))
    for name in cases:
        (maps / name).symlink_to(args.pred_dir.resolve() / name)
    labels = str([k for k in range(1, args.classes)])
    commands = {}
    for n in sorted({1, args.workers}):
        commands[f"mcseg_workers{n}"] = [sys.executable, "-m", "mcseg.evaluate_folder", str(args.pred_dir),
                                         str(args.reference or args.labels), "--allow-missing", "--overwrite",
                                         "--workers", str(n), "-o", str(scratch / f"mcseg{n}" / "eval")]
        commands[f"mcseg_after_imports_workers{n}"] = [sys.executable, "-c", INNER, str(args.pred_dir),
                                                       str(args.reference or args.labels),
                                                       str(scratch / f"inner{n}" / "eval"), str(n)]
        commands[f"nnunet_processes{n}"] = [args.nnunet_python, "-c", NNUNET, str(args.labels), str(maps),
                                            str(scratch / f"nnunet{n}.json"), labels, str(n)]
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    names = list(commands)
    try:
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:  # a rotating order
                runs[name].append(_timed(commands[name], env))
                print(name, runs[name][-1], file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    def key(name: str) -> str:  # after the imports: mcseg's own timing of the evaluation
        return "inner_s" if name.startswith("mcseg_after_imports") else "wall_s"

    best = {name: min(t[key(name)] for t in ts) for name, ts in runs.items()}
    median = {name: sorted(t[key(name)] for t in ts)[len(ts) // 2] for name, ts in runs.items()}
    n = args.workers
    result = {"cases": len(cases), "cpus": os.cpu_count(), "workers": n, "repeats": args.repeats,
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs, "best_s": best,
              "median_s": median,
              "ratios_of_medians": {
                  "mcseg_1_over_nnunet_1": median["mcseg_workers1"] / median["nnunet_processes1"],
                  f"mcseg_{n}_over_nnunet_{n}": median[f"mcseg_workers{n}"] / median[f"nnunet_processes{n}"],
                  f"mcseg_speedup_{n}_workers": median["mcseg_workers1"] / median[f"mcseg_workers{n}"],
                  f"mcseg_speedup_{n}_workers_after_imports": (median["mcseg_after_imports_workers1"]
                                                               / median[f"mcseg_after_imports_workers{n}"]),
                  f"nnunet_speedup_{n}_processes": median["nnunet_processes1"] / median[f"nnunet_processes{n}"]},
              "commands": {k: " ".join(v[:3] + ["..."] if "-c" in v else v) for k, v in commands.items()}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_s", "ratios_of_medians")}, indent=1))
    return 0


def _copies(args, scratch: Path) -> None:
    """``args.pred_dir`` and ``args.labels`` replaced by folders of links holding every case ``args.copies`` times."""
    pred, labels = scratch / "copies" / "pred", scratch / "copies" / "labels"
    pred.mkdir(parents=True)
    labels.mkdir()
    if args.dataset_json is None:
        raise SystemExit("--copies needs --dataset-json (the classes of the linked label folder)")
    (scratch / "copies" / "dataset.json").symlink_to(args.dataset_json.resolve())
    cases = sorted(f.name[:-len(".nii.gz")] for f in args.pred_dir.glob("*.nii.gz") if "_probs" not in f.name)
    for i in range(args.copies * len(cases)):
        case, name = cases[i % len(cases)], f"case_{i:05d}"
        (pred / f"{name}.nii.gz").symlink_to(args.pred_dir.resolve() / f"{case}.nii.gz")
        (pred / f"{name}_probs.nii.gz").symlink_to(args.pred_dir.resolve() / f"{case}_probs.nii.gz")
        (labels / f"{name}.nii.gz").symlink_to(args.labels.resolve() / f"{case}.nii.gz")
    args.pred_dir, args.labels, args.reference = pred, labels, labels


def _scaling(args) -> int:
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    scratch = Path(tempfile.mkdtemp(prefix="bench_folder_scaling_"))
    if args.copies > 1:
        _copies(args, scratch)
    names = sorted(f.name[:-len(".nii.gz")] for f in args.pred_dir.glob("*.nii.gz") if "_probs" not in f.name)
    n_cases = len(names)
    try:
        splits = scratch / "splits_by_hand.json"  # the split arm's parts: every N-th case from the k-th
        splits.write_text(json.dumps([{"train": [], "val": names[k::args.workers]} for k in range(args.workers)]))
        done = subprocess.run([sys.executable, "-c", SCALING, str(args.pred_dir), str(args.reference or args.labels),
                               str(scratch), str(args.workers), str(args.repeats), str(splits)], env=env,
                              capture_output=True, text=True, check=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    runs = json.loads(done.stdout.strip().splitlines()[-1])["scaling"]
    arm = {name: [r["inner_s"] for r in sorted(runs, key=lambda r: r["round"]) if r["arm"] == name]
           for name in ("workers1", f"workers{args.workers}", "split", "part_alone")}
    ones, many = arm["workers1"], arm[f"workers{args.workers}"]

    def per_round(a, b):  # each round's timings, side by side
        return [round(x / y, 3) for x, y in zip(a, b)]

    result = {"cpus": os.cpu_count(), "workers": args.workers, "rounds": args.repeats, "copies": args.copies,
              "cases": n_cases,
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs,
              "speedup_per_round": per_round(ones, many), "speedup_of_best": min(ones) / min(many),
              # the plain alternative: the folder split by hand into N parts evaluated side by side
              "split_by_hand_speedup_per_round": per_round(ones, arm["split"]),
              # the workers against the split by hand (> 1: --workers N is faster)
              "workers_over_split_per_round": per_round(arm["split"], many),
              # how much the parts slow each other side by side: the split's wall over one part alone
              "side_by_side_slowdown_per_round": per_round(arm["split"], arm["part_alone"])}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.endswith("per_round") or k == "speedup_of_best"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Overhead per job of mcseg's launchers on this machine (docs/scaling.md, "Measured overhead").

Runs the same tiny sweep (``JOBS`` trainings of one epoch on the synthetic 2D task) through each launcher and
compares the sweep's wall time with the jobs' own time (``wall_time_s`` of each ``status.json``: from the job's
start in ``mcseg.sweep.run_job`` to its end). With ``P`` jobs at a time, the overhead per job is the slot time
not spent inside a job: ``(P * sweep wall - sum of job times) / JOBS`` (process and worker start-up, imports,
Hydra's per-job composition, waiting for the last job). ``python scripts/bench_launchers.py [--jobs 4]``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["debug=fast", "logger.images=0", "dataset.n_cases=8", "dataset.shape=[32,32]",
        "dataset.sampling.patch_size=[32,32]", "model.channels=[8,16,32]", "model.strides=[2,2]",
        "model.num_res_units=1", "posthoc.fit=[]", "posthoc.apply=[]", "trainer.max_epochs=1"]
LAUNCHERS = {  # name: (extra overrides, jobs at a time)
    "basic (sequential)": ([], 1),
    "slots, 2 CPU slots": (["hydra/launcher=slots", "hydra.launcher.cpu_slots=2"], 2),
    "submitit local": (["hydra/launcher=submitit_debug"], None),  # all jobs at once
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the rows, the load before and after, the command, the "
                        "times and the code commit here (the raw output beside docs/scaling.md's table)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"command": " ".join(sys.argv), "commit": commit, "cpus": os.cpu_count(),
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_before": os.getloadavg()[0],
              "rows": []}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| launcher | jobs | at a time | sweep wall s | jobs' own s (sum) | overhead per job s |")
    print("|---|---|---|---|---|---|")
    for name, (extra, parallel) in LAUNCHERS.items():
        parallel = parallel or args.jobs
        with tempfile.TemporaryDirectory() as tmp:
            sweep = Path(tmp) / "sweep"
            start = time.perf_counter()
            done = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", *extra,
                                   f"seed=range(0,{args.jobs})", f"hydra.sweep.dir={sweep}", *TINY],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wall = time.perf_counter() - start
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            own = [json.loads(p.read_text())["wall_time_s"] for p in sweep.glob("*/status.json")]
        overhead = (parallel * wall - sum(own)) / len(own)
        record["rows"].append({"launcher": name, "jobs": len(own), "at_a_time": parallel, "sweep_wall_s": wall,
                               "jobs_own_s": own, "overhead_per_job_s": overhead})
        print(f"| {name} | {len(own)} | {parallel} | {wall:.1f} | {sum(own):.1f} | {overhead:.1f} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        record.update(load_after=os.getloadavg()[0], ended_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

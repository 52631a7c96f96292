"""What predictors of several members cost: ensembles, MC dropout and TTA against one network, side by side.

    python scripts/bench_members.py [--cases 8] [--shape 36 50 36] [--out docs/benchmarks.json]

Each measurement runs in a process of its own (its peak resident memory is its own): the evaluation of
``--cases`` synthetic volumes of the hippocampus crops' size (``--shape``) with the ``hippocampus_cpu``
network (3D U-Net, channels 8-128, whole volume in one window) through mcseg's one evaluation path
(:func:`mcseg.evaluation.cases.evaluate_cases`: inference, the evaluator, failure detection). For K = 1, 3, 5
members: an ensemble of K networks, K MC-dropout samples, and TTA (flips: 8 views; flips + noise: 16). The
ratio to K single evaluations shows the pooling's overhead (the issue's bound: 1.15); memory must not grow
with K. Weights are random: the cost of a pass does not depend on them.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(mode: str, k: int, cases: int, shape: list[int]) -> dict:
    """Run in a child process: time the evaluation of ``cases`` volumes with ``k`` members of ``mode``."""
    import numpy as np
    import torch
    from monai.networks.nets import UNet

    from mcseg.config import EvalProtocol
    from mcseg.data.cases import CaseData
    from mcseg.evaluation.evaluator import Evaluator
    from mcseg.config import InferenceConfig
    from mcseg.evaluation.cases import evaluate_cases
    from mcseg.inference.predict import EnsemblePredictor, SegmentationPredictor
    from mcseg.metrics.failure import FailureDetection
    from mcseg.metrics.uncertainty import MAPS

    torch.manual_seed(0)
    dropout = 0.2 if mode == "mc" else 0.0

    def net():
        return UNet(3, 1, 3, channels=(8, 16, 32, 64, 128), strides=(1, 2, 2, 2), num_res_units=1,
                    norm="instance", dropout=dropout).eval()

    def predictor(model, **members):
        cfg = InferenceConfig(overlap=0.5, **members)
        return SegmentationPredictor(model, 3, 8, lambda z: torch.softmax(z, 1), False, cfg, [40, 56, 40], "32",
                                     torch.device("cpu"))

    if mode == "single" or (mode == "ensemble" and k == 1):
        p = predictor(net())
    elif mode == "ensemble":
        p = EnsemblePredictor([predictor(net()) for _ in range(k)])
    elif mode == "mc":
        p = predictor(net(), mc_samples=k)
    elif mode == "tta":
        p = predictor(net(), tta=["flips"] if k == 8 else ["flips", "noise"])
    else:
        raise ValueError(mode)
    rng = np.random.default_rng(0)
    data = [CaseData(f"c{i}", rng.standard_normal((1, *shape)).astype(np.float32),
                     rng.integers(0, 3, shape).astype(np.int64), (1.0, 1.0, 1.0), np.eye(4)) for i in range(cases)]
    protocol = EvalProtocol(bootstrap_samples=0)
    evaluator = Evaluator(3, ["background", "anterior", "posterior"], protocol)
    failure = FailureDetection(MAPS)
    start = time.perf_counter()
    evaluate_cases(p, iter(data), evaluator, lambda case, probs: (probs, case.label, case.spacing, case.affine),
                   failure=failure)
    seconds = time.perf_counter() - start
    return {"mode": mode, "members": p.n_members, "seconds": seconds,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--shape", type=int, nargs=3, default=[36, 50, 36])
    parser.add_argument("--child", nargs=2, metavar=("MODE", "K"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help="merge the figures into this JSON file")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child[0], int(args.child[1]), args.cases, args.shape)))
        return
    plan = [("single", 1), ("ensemble", 3), ("ensemble", 5), ("mc", 3), ("mc", 5), ("tta", 8), ("tta", 16)]
    rows = []
    for mode, k in plan:
        done = subprocess.run([sys.executable, __file__, "--child", mode, str(k), "--cases", str(args.cases),
                               "--shape", *map(str, args.shape)], capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    single = rows[0]["seconds"]
    print(f"\n| predictor | members | seconds | x K single evaluations | peak RSS (MB) |\n|---|---|---|---|---|")
    for row in rows:
        ratio = row["seconds"] / (single * row["members"])
        row["ratio_to_k_single"] = ratio
        print(f"| {row['mode']} | {row['members']} | {row['seconds']:.1f} | {ratio:.2f} | {row['peak_rss_mb']:.0f} |")
    if args.out:
        data = json.loads(args.out.read_text()) if args.out.is_file() else {}
        data["members"] = {"cases": args.cases, "shape": args.shape, "rows": rows,
                           "measured": time.strftime("%Y-%m-%d")}
        args.out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()

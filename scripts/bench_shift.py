"""What a corruption suite costs (issue #24, section 3): ``evaluate.py shift=<suite>`` against plain evaluations.

    python scripts/bench_shift.py <run dir> [--suite rood_mri] [--repeats 3] [--out docs/results/bench_shift.json]

Measured in one run on the same machine, with the run's ``best.pt``, its test split and its post-hoc scalers:

* a plain evaluation: ``evaluate.py ckpt=<run> eval_dir=<tmp>`` (the clean test cases: inference, metrics,
  post-hoc scaled figures, per-case table), ``--repeats`` times (half before the suite, half after), its median
  wall time;
* the suite: ``evaluate.py ckpt=<run> shift=<suite>`` into an evaluation whose clean level exists (so only the
  corrupted conditions are timed: ``seconds`` of its ``shift_summary.json``), reading, corrupting (MONAI /
  TorchIO on the raw image), predicting and scoring every (corruption, level) of it.

The suite's bound is ``suite <= 1.3 x n_conditions x plain`` (10 corruptions x 5 levels: 50 plain evaluations);
the ratio printed is ``suite / (n_conditions x plain)``. Both sides write no predictions and no figures
(``evaluation.figures=false``: the two PNGs of a plain evaluation would flatter the ratio). Writes a JSON record
with the machine, thread count and load, and prints a markdown row for docs/benchmarks.md.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

from mcseg.config import CONFIG_DIR  # noqa: E402
from mcseg.environment import environment_record  # noqa: E402

COMMON = ["save_predictions=false", "evaluation.figures=false", "device=cpu"]


def _evaluate(ckpt: Path, out: Path, overrides: list[str]) -> tuple[dict, float]:
    from mcseg.evaluation.checkpoint import evaluate_checkpoint

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[*COMMON, *overrides])
    cfg.ckpt, cfg.eval_dir, cfg.paths.output_dir = str(ckpt), str(out), str(out.parent / "job")
    start = time.perf_counter()
    summary = evaluate_checkpoint(cfg, ckpt, [*COMMON, *overrides])
    return summary, time.perf_counter() - start


def measure(run: Path, suite: str, repeats: int, subset: list[str]) -> dict:
    ckpt = run / "checkpoints" / "best.pt"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_shift_") as tmp:
        # plain evaluations before and after the suite: on a machine whose load changes, both sides see it
        before = [_evaluate(ckpt, Path(tmp) / f"plain{i}" / "test", [])[1] for i in range((repeats + 1) // 2)]
        _evaluate(ckpt, Path(tmp) / "suite" / "test", [])  # the clean level (reused by the suite, not timed)
        summary, wall = _evaluate(ckpt, Path(tmp) / "suite" / "test", [f"shift={suite}", *subset])
        after = [_evaluate(ckpt, Path(tmp) / f"plain{i}" / "test", [])[1] for i in range(len(before), repeats)]
        plain = before + after
    shift = summary["shift"]
    conditions = len(shift["corruptions"]) * (len(shift["levels"]) - 1)
    per_plain = statistics.median(plain)
    return {"run": str(run), "suite": suite, "subset": subset, "conditions": conditions,
            "cases": len(summary["provenance"]["split"]["cases"]),
            "plain_seconds": [round(s, 4) for s in plain], "plain_median_seconds": round(per_plain, 4),
            "suite_seconds": shift["seconds"], "suite_wall_seconds": round(wall, 1),
            "ratio": round(shift["seconds"] / (conditions * per_plain), 3), "bound": 1.3,
            "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "environment": environment_record("cpu", False)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--suite", default="rood_mri")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--subset", nargs="*", default=[],
                        help="overrides of the suite, e.g. 'shift.levels=[1,5]' (a smoke run; the bound is stated "
                             "for the whole suite)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    record = measure(args.run.resolve(), args.suite, args.repeats, args.subset)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "environment"}, indent=1))
    print(f"| {record['suite']} | {record['conditions']} | {record['cases']} | {record['plain_median_seconds']:.1f} | "
          f"{record['suite_seconds']:.0f} | {record['ratio']:.2f} |")
    return 0 if record["ratio"] <= record["bound"] else 1


if __name__ == "__main__":
    sys.exit(main())

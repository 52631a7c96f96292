"""The new-case statements' guarantees over random calibration / test splits (docs/new_cases.md, docs/results.md).

    python scripts/statements_validity.py OUT/calibration_cases.csv OUT/new_cases.csv -o DIR \
        [--alpha 0.05 0.1 0.2] [--repeats 200] [--seed 0] [--delta 0.1] [--floor 0.7]

Reads the per-case tables that ``mcseg-new-cases`` writes (the new cases labelled: run it with a reference that has
their labels), pools them, and writes DIR/validity_splits.csv (every split), DIR/validity.csv (per level, statement
and structure), DIR/rank_correlations.csv and DIR/validity.md (:mod:`mcseg.statements.validity`). The calibration
part of each split has as many cases as the first table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcseg.files import write_csv  # noqa: E402
from mcseg.statements.table import CaseTable, read_table  # noqa: E402
from mcseg.statements.validity import rank_correlations, split_rows, summarise_rows  # noqa: E402


def markdown(summary: list[dict], correlations: list[dict], n_cases: int, n_calibration: int, repeats: int) -> str:
    lines = [f"{repeats} random splits of {n_cases} labelled cases: {n_calibration} calibration, "
             f"{n_cases - n_calibration} test.", "",
             "| alpha | statement | structure | mean coverage +- SE | splits below 1 - alpha | mean width | "
             "infinite | mean truth |", "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["statement"] != "review":
            lines.append(f"| {s['alpha']} | {s['statement']} | {s['structure']} | {s['mean_coverage']:.3f} +- "
                         f"{s['se']:.3f} | {s['splits_below_level']:.2f} | {s['mean_width']:.3g} | "
                         f"{s['infinite_share']:.2f} | {s['mean_true']:.3g} |")
    lines += ["", "| alpha | review: violation rate | certified | flagged | failure rate among accepted |",
              "|---|---|---|---|---|"]
    for s in summary:
        if s["statement"] == "review":
            lines.append(f"| {s['alpha']} | {s['violation_rate']:.3f} | {s['certified_share']:.2f} | "
                         f"{s['flagged_share']:.3f} | {s['failure_rate_accepted']:.3f} |")
    lines += ["", "| structure | figure | Spearman with true Dice |", "|---|---|---|"]
    lines += [f"| {c['structure']} | {c['figure']} | {c['spearman_with_true_dice']:.3f} |" for c in correlations]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("calibration", type=Path, help="calibration_cases.csv of mcseg-new-cases")
    p.add_argument("new", type=Path, help="new_cases.csv of mcseg-new-cases (labelled)")
    p.add_argument("-o", "--output-dir", type=Path, required=True)
    p.add_argument("--alpha", nargs="+", type=float, default=[0.05, 0.1, 0.2])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delta", type=float, default=0.1)
    p.add_argument("--floor", type=float, default=0.7)
    args = p.parse_args(argv)
    calibration, new = read_table(args.calibration), read_table(args.new)
    if not new.labelled:
        p.error(f"{args.new}: the new cases have no truth columns; run mcseg-new-cases with their labels")
    pooled = CaseTable.join([calibration, new])
    rows = split_rows(pooled, len(calibration), args.alpha, args.repeats, args.seed, args.delta, args.floor)
    summary = summarise_rows(rows)
    correlations = rank_correlations(pooled)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    columns = lambda table: list(dict.fromkeys(k for r in table for k in r))  # noqa: E731 (review rows: more)
    write_csv(out / "validity_splits.csv", rows, columns(rows))
    write_csv(out / "validity.csv", summary, columns(summary))
    write_csv(out / "rank_correlations.csv", correlations)
    (out / "validity.md").write_text(markdown(summary, correlations, len(pooled), len(calibration), args.repeats))
    print((out / "validity.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

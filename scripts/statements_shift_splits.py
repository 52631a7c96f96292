"""The plain and the weighted statements under shift over random calibration draws, from the per-case tables that
scripts/statements_shift.py leaves (docs/results.md, "Statements for new cases"):

    python scripts/statements_shift_splits.py docs/results/new_cases/shift_cedice_s0 -o DIR \
        [--alpha 0.1] [--repeats 200] [--seed 0]

Reads SHIFT/calibration_cases.csv (the run's labelled validation cases), SHIFT/clean/0/none/new_cases.csv (its
clean test cases) and SHIFT/<corruption>/<level>/none/new_cases.csv (the corrupted test cases, labelled): the
label-free figures and the truth, nothing else. The clean cases are pooled; each draw calibrates on as many of
them as the validation table holds, drawn at random, and states about every condition's versions of the others
(:mod:`mcseg.statements.shift_validity`). Writes DIR/shift_splits.csv (per draw, condition, statement and
structure; not committed: it recomputes), DIR/shift_splits_summary.csv and DIR/shift_splits.md (per level).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcseg.files import write_csv  # noqa: E402
from mcseg.statements.shift_validity import shift_split_rows, summarise_shift_rows  # noqa: E402
from mcseg.statements.table import CaseTable, read_table  # noqa: E402


def read_conditions(shift: Path) -> tuple[CaseTable, CaseTable, dict[tuple[str, int], CaseTable]]:
    """``(validation cases, clean test cases, {(condition, level): its cases})`` from a statements_shift.py folder;
    the clean test cases are also the condition ("clean", 0)."""
    validation = read_table(shift / "calibration_cases.csv")
    clean = read_table(shift / "clean" / "0" / "none" / "new_cases.csv")
    conditions = {("clean", 0): clean}
    for path in sorted(shift.glob("*/*/none/new_cases.csv")):
        condition, level = path.parents[2].name, path.parents[1].name
        if condition != "clean":
            conditions[condition, int(level)] = read_table(path)
    return validation, clean, conditions


def markdown(summary: list[dict], alpha: float, repeats: int, n_pool: int, n_calibration: int) -> str:
    lines = [f"{repeats} random draws of {n_calibration} calibration cases from {n_pool} clean labelled cases; new "
             f"cases: each condition's versions of the cases not drawn (mean n_new per condition below). Coverage "
             f"at level {1 - alpha:g}, mean over draws +- standard error (each draw's mean over the level's "
             f"conditions), plain / weighted; the median width of the finite statements (1 - bound for Dice, the "
             f"bound for HD95; the weighted: mean over draws with one); the share of infinite weighted statements; "
             f"n_eff of the calibration weights.", "",
             "| level | statement | structure | coverage plain | weighted | width plain | weighted | infinite | "
             "n_eff | n_new |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['level']} | {s['statement']} | {s['structure']} | {s['coverage_plain']:.3f} +- "
                     f"{s['coverage_plain_se']:.3f} | {s['coverage_weighted']:.3f} +- {s['coverage_weighted_se']:.3f} "
                     f"| {s['width_plain']:.3g} | {s['width_weighted']:.3g} | {s['infinite_weighted']:.2f} | "
                     f"{s['n_eff']:.1f} | {s['n_new']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shift", type=Path, help="a scripts/statements_shift.py output folder")
    p.add_argument("-o", "--output-dir", type=Path, required=True)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    validation, clean, conditions = read_conditions(args.shift)
    pool = CaseTable.join([validation, clean])
    rows = shift_split_rows(pool, conditions, len(validation), args.alpha, args.repeats, args.seed)
    summary = summarise_shift_rows(rows)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "shift_splits.csv", rows)
    write_csv(out / "shift_splits_summary.csv", summary)
    text = markdown(summary, args.alpha, args.repeats, len(pool), len(validation))
    (out / "shift_splits.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

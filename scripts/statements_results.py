"""The new-case statements' study tables from their committed pieces (docs/results.md, "Statements for new cases").

    python scripts/statements_results.py docs/results/new_cases

Reads ``<dir>/<run>/<raw|temperature>/validity.csv`` and ``rank_correlations.csv`` (scripts/statements_validity.py)
and writes ``<dir>/summary.md``: per source, level, statement and structure the mean coverage over the runs' random
splits (each run's mean +- SE, then min..max over runs), the mean width beside the mean true value, and per level
the review rule's violation rate, certified share and flagged share; the rank correlations with the true Dice.
"""
from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def _read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def main(argv: list[str] | None = None) -> int:
    root = Path((argv or sys.argv[1:])[0])
    pieces = sorted(root.glob("*/*/validity.csv"))
    if not pieces:
        print(f"{root}: no <run>/<source>/validity.csv", file=sys.stderr)
        return 2
    coverage: dict[tuple, list] = defaultdict(list)
    review: dict[tuple, list] = defaultdict(list)
    correlations: dict[tuple, list] = defaultdict(list)
    runs = sorted({p.parent.parent.name for p in pieces})
    for path in pieces:
        run, source = path.parent.parent.name, path.parent.name
        for r in _read(path):
            key = (source, float(r["alpha"]), r["statement"], r["structure"])
            (review if r["statement"] == "review" else coverage)[key].append((run, r))
        for r in _read(path.parent / "rank_correlations.csv"):
            correlations[source, r["structure"], r["figure"]].append(float(r["spearman_with_true_dice"]))
    lines = [f"Runs: {', '.join(runs)}. Per run, 200 random splits of its 62 labelled cases (31 calibration, "
             f"31 test; scripts/statements_validity.py); below, per source, level, statement and structure: the "
             f"runs' mean coverage over their splits (min..max over runs), the share of splits below 1 - alpha "
             f"(mean over runs), the mean interval or bound width and the mean true value (means over runs).", "",
             "| source | alpha | statement | structure | mean coverage (min..max over runs) | splits below | "
             "mean width | mean truth |", "|---|---|---|---|---|---|---|---|"]
    for (source, alpha, name, structure), found in sorted(coverage.items()):
        c = np.array([float(r["mean_coverage"]) for _, r in found])
        below = np.mean([float(r["splits_below_level"]) for _, r in found])
        width = np.mean([float(r["mean_width"]) for _, r in found])
        truth = np.mean([float(r["mean_true"]) for _, r in found])
        lines.append(f"| {source} | {alpha:g} | {name} | {structure} | {c.mean():.3f} ({c.min():.3f}..{c.max():.3f}) | "
                     f"{below:.2f} | {width:.3g} | {truth:.3g} |")
    lines += ["", "Review flag (Learn-then-Test, fixed sequence, delta 0.1, floor Dice 0.7): per source and level, over "
              "the runs (min..max): the violation rate (share of splits whose failure rate among the accepted test "
              "cases exceeds alpha), the share of splits with a certified rule, the share of test cases flagged.", "",
              "| source | alpha | violation rate | certified | flagged |", "|---|---|---|---|---|"]
    for (source, alpha, _, _), found in sorted(review.items()):
        cells = []
        for key in ("violation_rate", "certified_share", "flagged_share"):
            v = np.array([float(r[key]) for _, r in found])
            cells.append(f"{v.mean():.3f} ({v.min():.3f}..{v.max():.3f})")
        lines.append(f"| {source} | {alpha:g} | " + " | ".join(cells) + " |")
    lines += ["", "Spearman rank correlation with the true Dice over each run's 62 cases (mean, min..max over runs):",
              "", "| source | structure | figure | rho |", "|---|---|---|---|"]
    for (source, structure, figure), values in sorted(correlations.items()):
        v = np.array(values)
        lines.append(f"| {source} | {structure} | {figure} | {v.mean():.3f} ({v.min():.3f}..{v.max():.3f}) |")
    (root / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

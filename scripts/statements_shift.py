"""The new-case statements under shift: plain and weighted (docs/new_cases.md) on a run's corrupted test cases.

    python evaluate.py ckpt=$R split=val save_probabilities=true
    python evaluate.py ckpt=$R split=test save_probabilities=true shift=rood_mri shift.save_probabilities=true \
        shift.corruptions=[ghosting,bias_field,rician_noise] shift.levels=[1,3,5]
    python scripts/statements_shift.py $R --reference $HIPPO -o DIR [--alpha 0.1] [--split test]

For the clean test cases (level 0) and each condition of ``<run>/eval/<split>/shift/<corruption>/<level>/`` whose
probabilities were saved, ``mcseg-new-cases`` is fitted on the run's validation cases and applied to the condition's
cases twice, plain and ``--shift weighted``; the conditions' labels (the reference's: corruptions that move the label,
affine and elastic, are left out) measure the coverage of each statement. Writes DIR/shift_coverage.csv (per
corruption, level, statement, structure: the plain and the weighted coverage, their widths, the share of infinite
weighted statements, the effective sample size),
DIR/shift_coverage.md (per level, means over the corruptions) and, per condition, the two folders of statements.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcseg.files import write_csv  # noqa: E402
from mcseg.new_cases import main as new_cases  # noqa: E402
from mcseg.statements.intervals import STATEMENTS  # noqa: E402
from mcseg.statements.statements import COLUMNS as ENDS  # noqa: E402

MOVES_LABEL = ("affine", "elastic_deformation")


def coverage(folder: Path) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Per statement and structure: (coverage, median width of the finite statements, share infinite); a one-sided
    statement's width is its distance from its range's end (1 - Dice bound, the HD95 bound)."""
    with (folder / "statements.csv").open() as f:
        rows = list(csv.DictReader(f))
    out = {}
    for name in (n for n in STATEMENTS if f"{n}_covered" in rows[0]):  # volume_members: only with members
        low, high = ENDS[name]
        for structure in dict.fromkeys(r["structure"] for r in rows):
            own = [r for r in rows if r["structure"] == structure]
            widths = np.array([(float(r[high]) if high else 1.0) - (float(r[low]) if low else 0.0) for r in own])
            finite = widths[np.isfinite(widths)]
            out[name, structure] = (float(np.mean([r[f"{name}_covered"] == "True" for r in own])),
                                    float(np.median(finite)) if finite.size else float("inf"),
                                    float(1 - finite.size / widths.size))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--reference", type=Path, required=True)
    p.add_argument("-o", "--output-dir", type=Path, required=True)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--split", default="test")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more mcseg-new-cases options")
    args = p.parse_args(argv)
    evaluation = args.run / "eval" / args.split
    conditions = [("clean", 0, evaluation / "predictions")]
    for folder in sorted((evaluation / "shift").glob("*/*/predictions")):
        corruption, level = folder.parent.parent.name, folder.parent.name
        if corruption not in MOVES_LABEL and any(folder.glob("*_probs.nii.gz")):
            conditions.append((corruption, int(level), folder))
    rows = []
    for corruption, level, folder in conditions:
        found = {}
        for mode in ("none", "weighted"):
            out = args.output_dir / corruption / str(level) / mode
            code = new_cases(["--fit", str(args.run / "eval/val/predictions"), "--reference", str(args.reference),
                              "--apply", str(folder), "-o", str(out), "--alpha", str(args.alpha), "--shift", mode,
                              "--overwrite", *args.extra])
            if code:
                return code
            found[mode] = coverage(out)
        n_eff = json.loads((args.output_dir / corruption / str(level) / "weighted" / "statements.json")
                           .read_text())["shift"]["n_eff"]
        for (name, structure), (plain, width, _) in found["none"].items():
            weighted, weighted_width, infinite = found["weighted"][name, structure]
            rows.append({"corruption": corruption, "level": level, "statement": name, "structure": structure,
                         "coverage_plain": plain, "coverage_weighted": weighted, "width_plain": width,
                         "width_weighted": weighted_width, "infinite_weighted": infinite, "n_eff": n_eff})
    write_csv(args.output_dir / "shift_coverage.csv", rows)
    lines = [f"Coverage of the statements at level {1 - args.alpha:g} on the run's {args.split} cases, clean (level 0) "
             f"and corrupted (mean over {len({r['corruption'] for r in rows}) - 1} corruption(s) per level): plain / "
             f"weighted, the median width of the finite statements (1 - bound for Dice, the bound for HD95) plain / "
             f"weighted, and the share of infinite weighted statements.", "",
             "| level | statement | structure | coverage plain | weighted | width plain | weighted | infinite | n_eff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for level in sorted({r["level"] for r in rows}):
        for name in dict.fromkeys(r["statement"] for r in rows):
            for structure in dict.fromkeys(r["structure"] for r in rows):
                own = [r for r in rows if r["level"] == level and r["statement"] == name
                       and r["structure"] == structure]
                mean = lambda key: np.mean([r[key] for r in own])  # noqa: E731
                lines.append(f"| {level} | {name} | {structure} | {mean('coverage_plain'):.3f} | "
                             f"{mean('coverage_weighted'):.3f} | {mean('width_plain'):.3g} | "
                             f"{mean('width_weighted'):.3g} | {mean('infinite_weighted'):.2f} | {mean('n_eff'):.1f} |")
    (args.output_dir / "shift_coverage.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

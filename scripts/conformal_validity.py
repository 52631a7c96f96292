"""Conformal guarantees checked over random calibration / test splits of the cases of prediction folders.

    python scripts/conformal_validity.py --predictions VAL_DIR [...] --reference REF [--alpha 0.05 0.1 0.2]
        [--method crc] [--loss fnr] [--delta 0.1] [--calibration 0.5] [--repeats 200] [--seed 0] -o table.csv

Every case of the folders (disjoint folders, e.g. nnU-Net's fold_k/validation, or one folder; ``--splits --fold``
to choose) is read once and summarised (:func:`mcseg.conformal_folder.summarise_fit`: counts on the threshold
grid, margins in mm); then, for each alpha, ``--repeats`` random splits into ``--calibration`` (a fraction, or a
number of cases) calibration cases and the others as test cases (:func:`mcseg.conformal.validity.over_alphas`):
per class the mean test risk with its Monte-Carlo standard error (<= alpha for CRC), the violation rate (test risk
> alpha; <= delta for RCPS and LTT), the mean threshold, the set's volume over the predicted structure's (what
the guarantee costs), and the margins' coverage and mean size. Re-splitting one
pool gives dependent repeats: the spread is a sanity check, not an exact test (reference B8). Writes a CSV and
prints a Markdown table (``--figure``: the mean test risk against alpha and the margins' coverage against
1 - alpha, :func:`mcseg.conformal.plots.coverage_figure`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("class", "method", "loss", "alpha", "delta", "n_calibration", "n_test", "splits", "mean_test_risk",
           "mean_test_risk_se", "violation_rate", "violation_rate_se", "mean_threshold", "uncontrolled_splits",
           "mean_set_over_prediction", "mean_covered", "mean_sure_inside", "mean_outer_mm", "mean_inner_mm")


def _parser() -> argparse.ArgumentParser:
    from mcseg.conformal.validity import REPEATS
    from mcseg.conformal_folder import add_method_options
    from mcseg.evaluation.folder_options import add_input_options

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--predictions", nargs="+", type=Path, required=True, help="prediction folders, disjoint cases")
    p.add_argument("--reference", type=Path, required=True)
    add_method_options(p, alphas=True)
    p.add_argument("--calibration", type=float, default=0.5, help="a fraction (< 1) or a number of cases")
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--seed", type=int, default=0)
    add_input_options(p)
    p.add_argument("-o", "--output", type=Path, required=True, help="the CSV table")
    p.add_argument("--figure", type=Path, help="also the figure of the mean test risk against alpha and the "
                   "margins' coverage against 1 - alpha (PNG)")
    return p


def markdown(rows: list[dict]) -> str:
    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from mcseg.conformal import default_thresholds
    from mcseg.conformal.validity import coverage_title, over_alphas
    from mcseg.conformal_folder import settings_of, summarise_fit
    from mcseg.data.reference import fold_cases, read_reference
    from mcseg.evaluation.folder_posthoc import _fit_owners
    from mcseg.evaluation.formats import declared_classes, open_folder
    from mcseg.files import write_csv

    args = _parser().parse_args(argv)
    reference = read_reference(args.reference, args.class_names, args.num_classes, args.dataset_json,
                               declared=declared_classes(args.predictions[0]))
    args.alpha, alphas = args.alpha[0], args.alpha
    settings = settings_of(args, reference)
    folders = [open_folder(d, reference.task, args.fmt, args.monai_postfix) for d in args.predictions]
    owners = _fit_owners(folders, fold_cases(args.splits, args.fold) if args.splits else None)
    summaries, _ = summarise_fit(owners, reference, settings, default_thresholds(args.grid_size))
    n_cal = int(round(args.calibration * len(summaries))) if args.calibration < 1 else int(args.calibration)
    rows = over_alphas(summaries, settings, reference.task.class_names, alphas, n_cal, args.repeats, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_csv(args.output, rows)
    if args.figure is not None:
        from mcseg.conformal.plots import coverage_figure

        args.figure.parent.mkdir(parents=True, exist_ok=True)
        coverage_figure(rows, coverage_title(settings, len(summaries), n_cal, args.repeats)).savefig(args.figure,
                                                                                                   dpi=100)
    print(f"{len(summaries)} cases, {n_cal} to calibrate, {args.repeats} random splits; {args.output}")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

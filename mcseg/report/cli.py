"""``mcseg-report DIR...``: the comparison table and figures of every run under run or sweep directories.

Runs whose evaluation (or post-hoc temperature scaling) is missing are evaluated first with
``evaluate.py``'s code and default protocol, or listed with ``--no-eval``. Evaluations of other tools' prediction
folders under the directories (``mcseg-evaluate-folder``) are rows of their own, the tool in the loss column; the
conformal fits of runs, ensembles and ``mcseg-conformal-folder`` outputs have a section (:mod:`mcseg.report.conformal`).
Writes
``report.md``, ``report.csv``, ``report.tex``, ``reliability_selected.png``,
``reliability_histogram_selected.png`` (the dataset reliability histograms), where the evaluations scored
several raters ``reliability_raters.png`` (against the rater mean beside against one rater), for margin sweeps
``margin_heatmap.png`` and, where runs or ensembles were evaluated under shift (``evaluate.py shift=...``),
``shift.csv`` and ``shift_severity.png`` (:mod:`mcseg.report.shift`), and ``report.html``, all of it on one
self-contained page with a per-case view (:mod:`mcseg.report.html`), into ``--out`` (default:
``<first DIR>/report``). One output folder of ``mcseg-calibrate-folder``, ``mcseg-conformal-folder`` or
``mcseg-new-cases`` given alone gets its own page instead (:mod:`mcseg.report.folder_report`), into ``--out`` or
the folder.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mcseg.files import atomic_write, check_writable
from mcseg.report.conformal import collect_conformal, conformal_section, folder_fits
from mcseg.report.statements import collect_statements, statement_folders, statements_section
from mcseg.report.collect import RunRecord, collect_ensembles, collect_folder_evaluations, collect_runs, read_run
from mcseg.report.figures import margin_heatmap, reliability_histograms, reliability_overlay, reliability_raters, \
    risk_coverage_overlay, shift_severity
from mcseg.report.folder_report import folder_output, write_folder_report
from mcseg.report.html import write_html
from mcseg.report.render import ENVIRONMENT_MARK, RATER_FIGURE, SEEN_MARK, SHIFT_FIGURE, latex, markdown, \
    write_report_csv, write_shift_csv
from mcseg.report.shift import add_shift
from mcseg.report.table import add_predictors, build_rows, common_overrides, mark_environments, mark_seen_in_training

log = logging.getLogger("mcseg.report")


def _needs_evaluation(run: RunRecord, scalers: list[str]) -> bool:
    return not run.evaluated or any(s not in run.summaries for s in scalers)


def evaluate_missing(runs: list[RunRecord], split: str, scalers: list[str], device: str) -> list[RunRecord]:
    """Evaluate runs that have a best.pt but no evaluation (or not the post-hoc ones); return them re-read."""
    from hydra import compose, initialize_config_dir

    from mcseg.config import CONFIG_DIR
    from mcseg.evaluation.checkpoint import evaluate_checkpoint

    out = []
    for run in runs:
        ckpt = run.path / "checkpoints" / "best.pt"
        if not _needs_evaluation(run, scalers) or not ckpt.is_file():
            out.append(run)
            continue
        log.info("evaluating %s (%s split)", run.path, split)
        overrides = [f"split={split}", f"device={device}", f"posthoc.apply=[{','.join(scalers)}]"]
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="evaluate", overrides=overrides)
        # set, not passed as overrides: sweep job directories hold '=' and ',' that the override grammar parses;
        # an evaluation without the post-hoc scalers is replaced by one of the same best.pt with them
        cfg.ckpt, cfg.paths.output_dir, cfg.overwrite = str(ckpt), str(run.path / "eval"), run.evaluated
        try:
            evaluate_checkpoint(cfg, ckpt, overrides)
        except Exception as exc:  # listed in the report as not evaluated; the others go on
            log.error("evaluation of %s failed: %s: %s", run.path, type(exc).__name__, exc)
        out.append(read_run(run.path, split) or run)
    return out


def protocol_lines(runs: list[RunRecord], args: argparse.Namespace) -> list[str]:
    evaluated = [r for r in runs if r.evaluated]
    protocol = evaluated[0].summaries[""].get("protocol", {}) if evaluated else {}
    detection = (evaluated[0].summaries[""].get("failure_detection") or {}).get("protocol") if evaluated else None
    # summaries from before failure_region and failure_risk: the calibration region and the macro risk
    failure = [] if not detection else [
        f"Failure detection (AURC, E-AURC, UEO, AUROC): case risk {detection.get('risk_definition', 'macro')} "
        f"({detection.get('risk')}); UEO and voxel AUROC over the voxels of region "
        f"`{detection.get('voxel_region', protocol.get('region'))}` (Jungo & Reyes: `all`, the whole image)."]
    return [
        f"Runs: {len(runs)} found, {len(evaluated)} evaluated on the **{args.split}** split "
        f"(directories: {', '.join(str(d) for d in args.dirs)}).",
        f"Cells: mean ± std over seeds of each run's mean over cases, [95% bootstrap CI over cases of the per-case "
        f"values averaged over seeds, {args.bootstrap} resamples]; (p: two-sided Wilcoxon signed-rank test over "
        f"cases against the baseline `{args.baseline}`, uncorrected; it pairs cases, not seeds, so read it "
        f"together with the std over seeds).",
        f"Overrides common to all configurations: `{' '.join(common_overrides([r.configuration for r in evaluated])) or 'none'}`.",
        f"Selection: each loss's configuration with the {args.select_mode} mean over seeds of `{args.select}` "
        f"(validation, from result.json) on each dataset ({', '.join(sorted({r.dataset for r in evaluated}))}); "
        f"runs on different datasets are never compared; the {args.split} split is not used to select.",
        f"Protocol: ECE region `{protocol.get('region')}`, {protocol.get('n_bins')} equal-width bins, top-label ECE "
        f"and classwise ECE per case then averaged; HD{protocol.get('hd_percentile', 95):g} in mm "
        f"({protocol.get('hd_definition')}); post_T: after temperature scaling fitted on the validation split "
        f"(on which voxels and by which objective: the post-hoc table, which also lists the other scalers); "
        f"T: mean fitted temperature.",
        *failure,
    ]


def failure_lines(runs: list[RunRecord]) -> list[str]:
    bad = [r for r in runs if r.status not in ("completed",) or not r.evaluated or r.duplicate_of]
    if not bad:
        return []
    lines = ["## Runs left out", "", "| run | status | error |", "|---|---|---|"]
    for r in bad:
        state = r.status if r.evaluated or r.status != "completed" else "not evaluated"
        error = r.error or ""
        if r.duplicate_of:
            state, error = "duplicate seed", f"dataset, configuration and seed {r.seed} of {r.duplicate_of}"
        lines.append(f"| {r.path} | {state} | {' '.join(error.replace('|', '/').split())} |")  # one row per run
    return ["", *lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcseg-report", description=__doc__.split("\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <first DIR>/report; for "
                        "one folder command's output given alone, its own page goes into that folder)")
    parser.add_argument("--split", default="test", help="evaluated split to report (default: test)")
    parser.add_argument("--select", default="score",
                        help="result.json value that selects each loss's hyperparameters (default: score)")
    parser.add_argument("--select-mode", choices=("max", "min"), default="max")
    parser.add_argument("--baseline", default="ce", help="loss the others are tested against (default: ce)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")
    parser.add_argument("--no-eval", action="store_true", help="list runs without an evaluation instead of evaluating")
    parser.add_argument("--device", default="auto", help="device for the evaluations of missing runs")
    parser.add_argument("--title", default=None)
    html = parser.add_argument_group("report.html (one self-contained page: docs/report_html.md)")
    html.add_argument("--html-cases", type=int, default=6, help="cases drawn in the per-case view, the worst first "
                      "by Dice (default: 6; 0: none)")
    html.add_argument("--html-size", type=int, default=160, help="pixels of a drawn slice's longer side (default: 160)")
    html.add_argument("--html-slices", type=int, default=32, help="slices drawn per case (default: 32)")
    html.add_argument("--images", type=Path, default=None, help="folder of the cases' images (<case>.nii.gz or "
                      "<case>_0000.nii.gz; default: the dataset's folder recorded in the evaluations)")
    html.add_argument("--labels", type=Path, default=None, help="folder of the cases' labels (default: as --images)")
    html.add_argument("--no-html", action="store_true", help="write no report.html")
    html.add_argument("--class-names", nargs="+", help="for a folder command's output (DIR): the K class names, "
                      "background first, where no dataset.json beside its reference says them")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(args.dirs) == 1 and folder_output(args.dirs[0]) is not None:  # a folder command's output: its own page
        out = args.out or args.dirs[0]
        try:
            check_writable(out)
            page = write_folder_report(args.dirs[0], out, images=args.images, cases=args.html_cases,
                                       max_size=args.html_size, max_slices=args.html_slices,
                                       class_names=args.class_names)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"written: {page} and {page.with_name('report.md')}")
        return 0

    out = args.out or args.dirs[0] / "report"
    try:
        check_writable(out)
    except OSError as exc:  # said before any run is evaluated or anything written
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        # mcseg's runs, and evaluations of other tools' prediction folders (mcseg-evaluate-folder) beside them
        runs = collect_runs(args.dirs, args.split) + collect_folder_evaluations(args.dirs)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not runs and not folder_fits(args.dirs) and not statement_folders(args.dirs):  # folder outputs alone
        print(f"error: no runs under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    if not args.no_eval:
        runs = evaluate_missing(runs, args.split, ["temperature"], args.device)
    rows = build_rows(runs, args.select, args.select_mode, args.baseline, args.bootstrap)
    ensembles = collect_ensembles(args.dirs, args.split)
    add_predictors(rows, ensembles)
    add_shift(rows, ensembles)
    differences, seen = mark_environments(rows), mark_seen_in_training(rows)
    for warning in differences:
        log.warning("warning: %s (rows marked%s)", warning, ENVIRONMENT_MARK)
    for warning in seen:
        log.warning("warning: %s (rows marked%s)", warning, SEEN_MARK)
    out.mkdir(parents=True, exist_ok=True)
    title = args.title or f"mcseg report: {len(rows)} configurations"
    notes = [f"**Warning{ENVIRONMENT_MARK}**: {w}; rows with a run unlike the most common are marked{ENVIRONMENT_MARK}."
             for w in differences]
    notes += [f"**Warning{SEEN_MARK}**: {w}: not figures of unseen data (rows marked{SEEN_MARK})." for w in seen]
    text = (markdown(rows, title, protocol_lines(runs, args) + notes) + "\n"
            + "\n".join([*conformal_section(collect_conformal(runs, ensembles, args.dirs, args.split), out),
                         *statements_section(collect_statements(runs, args.dirs, args.split)),
                         *failure_lines(runs)]))
    atomic_write(out / "report.md", lambda tmp: tmp.write_text(text))
    write_report_csv(rows, out / "report.csv")
    atomic_write(out / "report.tex", lambda tmp: tmp.write_text(latex(rows, title)))
    write_shift_csv(rows, out / "shift.csv")
    datasets = sorted({r.dataset for r in rows})
    figures = {}
    for dataset in datasets:  # one set of figures per dataset, named by it when there are several
        own = [r for r in rows if r.dataset == dataset]
        tag = f"_{dataset}" if len(datasets) > 1 else ""
        figures[f"reliability_selected{tag}.png"] = reliability_overlay(own, args.split)
        figures[f"reliability_histogram_selected{tag}.png"] = reliability_histograms(own, args.split)
        figures[f"{RATER_FIGURE}{tag}.png"] = reliability_raters(own, args.split)
        figures[f"margin_heatmap{tag}.png"] = margin_heatmap(own)
        figures[f"risk_coverage_selected{tag}.png"] = risk_coverage_overlay(own, args.split)
        suites = sorted({suite for r in own for suite, found in r.shift.items() if "single" in found})
        for suite in suites:  # of the single networks, named by the suite when there are several
            figures[f"{SHIFT_FIGURE}{tag}{f'_{suite}' if len(suites) > 1 else ''}.png"] = shift_severity(own, suite)
    for name, fig in figures.items():
        if fig is not None:
            atomic_write(out / name, lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=120))
    if not args.no_html:
        write_html(out, text, title, rows, args.split, [n for n, fig in figures.items() if fig is not None],
                   args.html_cases, args.html_size, args.html_slices, args.images, args.labels)
    print(text)
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

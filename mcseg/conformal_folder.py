"""``mcseg-conformal-folder --fit VAL_DIR [...] --reference REF [--apply TEST_DIR] -o OUT_DIR``

Conformal guarantees on another tool's (or mcseg's) saved probabilities (:mod:`mcseg.conformal`): per class, a
threshold t_k whose set {p_k >= t_k} controls the false-negative rate (or, with Learn-then-Test, the false-discovery
rate) of a new case, and outer / inner margins in mm, fitted on the cases of validation prediction folders
(nnU-Net's out-of-fold ``fold_k/validation``, a MONAI or mcseg folder, or the validation cases of ``--splits
--fold``) against their labels. Applied to a test folder, it writes per case and class the masks
``<case>_set_<class>.nii.gz``, ``<case>_possible_<class>.nii.gz`` (grown) and ``<case>_sure_<class>.nii.gz``
(shrunk) on the label's grid (with ``--figures`` an overlay ``<case>_conformal.png``), and, the test labels being
in the reference, what they achieve (``per_case.csv``, ``conformal.json`` ``test``) and, over ``--repeats`` random
re-splits of the fit and labelled test cases pooled, at ``--alpha`` and ``--alphas``, what the guarantee gives
(``validity.csv``, ``coverage.png``, ``conformal.json`` ``validity``; :func:`mcseg.conformal.validity.pooled_splits`).
Everything is recorded in ``OUT_DIR/conformal.json``. The output folder follows
:mod:`mcseg.evaluation.folder_outputs` (never another tool's folder; an earlier fit replaced only with
``--overwrite``; ``status.json`` while written).

The guarantee is per case and needs the test cases to be exchangeable with the calibration cases: a test folder
holding calibration cases is refused. ``--workers N`` reads the fit and test cases in N processes
(:mod:`mcseg.evaluation.case_pool`; the same files as one).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from mcseg.conformal import (ABSENT_POLICIES, LOSSES, METHODS, CaseSummary, ConformalSettings, case_sets, case_test,
                             default_thresholds, fit_margins, fit_thresholds, predicted_masks, summarise)
from mcseg.conformal.control import FWER_METHODS, RCPS_BOUNDS, NotMonotone, controllable
from mcseg.conformal.fit import class_indices
from mcseg.conformal.record import (CONFORMAL_FILE, class_records, fit_lines, settings_record, test_figures,
                                   versions, write_masks)
from mcseg.conformal.risks import class_masks
from mcseg.conformal.validity import ALPHAS, COVERAGE_FIGURE, REPEATS, VALIDITY_FILE, levels, pooled_splits
from mcseg.data.io import read_volume
from mcseg.data.reference import FolderError, Reference, fold_cases, read_reference
from mcseg.evaluation.dicom import dicom_modules
from mcseg.evaluation.folder_outputs import CONFORMAL_TOOL, claim_output, run_command, writing
from mcseg.evaluation.case_pool import check_workers, map_cases
from mcseg.evaluation.folder_options import add_fit_apply_options, add_input_options, add_workers_option
from mcseg.evaluation.folder_posthoc import _fit_owners
from mcseg.evaluation.folders import image_path, read_case, read_unlabelled
from mcseg.evaluation.formats import PredictionFormat, declared_classes, open_folder, prediction_files
from mcseg.evaluation.provenance import file_sha256
from mcseg.files import write_csv, write_json
from mcseg.evaluation.folder_dicom import conformal_to_dicom
from mcseg.report.folder_report import add_html_options, command_report

__all__ = ["conformal", "main"]


def add_method_options(p: argparse.ArgumentParser, alphas: bool = False) -> None:
    """What is controlled and how (:class:`mcseg.conformal.ConformalSettings`); ``alphas``: several levels."""
    if alphas:
        p.add_argument("--alpha", nargs="+", type=float, default=list(ALPHAS), help="the risk levels")
    else:
        p.add_argument("--alpha", type=float, default=0.1, help="the risk level (default 0.1)")
    p.add_argument("--method", choices=METHODS, default="crc")
    p.add_argument("--loss", choices=tuple(LOSSES), default="fnr",
                   help="fnr (monotone: crc, rcps, ltt) or fdr (not monotone: ltt only)")
    p.add_argument("--delta", type=float, help="failure probability of rcps and ltt (default 0.1 for them)")
    p.add_argument("--rcps-bound", choices=RCPS_BOUNDS, default="wsr")
    p.add_argument("--fwer", choices=FWER_METHODS, default="bonferroni_holm", help="LTT's multiple testing")
    p.add_argument("--absent", choices=tuple(ABSENT_POLICIES), default="skip",
                   help="a calibration case without the class: " + "; ".join(f"{k}: {v}" for k, v in
                                                                           ABSENT_POLICIES.items()))
    p.add_argument("--grid-size", type=int, default=101, help="thresholds 0, ..., 1 (default 101)")
    p.add_argument("--tau", type=float, default=1.0, help="the outer margin covers this fraction of the class")
    p.add_argument("--classes", nargs="+", help="class names to fit (default: every class but the background)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=CONFORMAL_TOOL,
        description="Fit per-class conformal thresholds (CRC, RCPS or Learn-then-Test on the per-case false-negative "
                    "or false-discovery rate) and margins in mm on saved validation probabilities of nnU-Net, MONAI "
                    "or mcseg, and write the set, grown and shrunk masks of a test folder.")
    add_fit_apply_options(
        p, fit="validation prediction folders holding different cases (e.g. nnU-Net's fold_k/validation)",
        reference="their labels (and the test cases'): an nnU-Net raw dataset, an MSD folder or <case>.nii.gz",
        apply="the prediction folder to give sets and margins",
        output="where conformal.json and the masks go: a new folder (never an input folder or another tool's; an "
               "earlier conformal fit only with --overwrite)",
        overwrite="replace an earlier conformal fit in OUT_DIR")
    add_method_options(p)
    p.add_argument("--figures", action="store_true", help="also <case>_conformal.png per test case: per class, on "
                   "its largest predicted slice, the prediction, the possible and sure masks and the ground truth")
    p.add_argument("--repeats", type=int, default=REPEATS,
                   help=f"random re-splits of the fit cases and the labelled --apply cases pooled, as many to "
                        f"calibrate as the fit has (0: none): {VALIDITY_FILE} and {COVERAGE_FIGURE} (default "
                        f"{REPEATS})")
    p.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS),
                   help=f"the levels of the re-splits, besides --alpha (default {' '.join(map(str, ALPHAS))})")
    p.add_argument("--images", type=Path, help="the --apply cases' images (<case>_0000.nii.gz or <case>.nii.gz, e.g. "
                   "an nnU-Net imagesTs): the grid of a case without a label, and what --figures draws beneath "
                   "(default: the class's probability)")
    p.add_argument("--dicom", action="store_true", help="also OUT_DIR/dicom/<case>/: the --apply cases' sure and "
                   "possible masks as DICOM BINARY Segmentations referencing the case's image series (--images, else "
                   "the reference's imagesTr / imagesTs; mcseg/evaluation/folder_dicom.py; docs/report_html.md)")
    add_workers_option(p, "read and summarise the fit cases and give the --apply cases their masks")
    add_html_options(p)
    add_input_options(p)
    return p


def settings_of(args: argparse.Namespace, reference: Reference) -> ConformalSettings:
    """The fit's settings from the command line: the classes by name (default every non-background channel)."""
    try:
        classes = class_indices(args.classes, reference.task.class_names, reference.task.multilabel)
    except ValueError as exc:
        raise FolderError(f"--classes: {exc}") from None
    delta = args.delta if args.delta is not None or args.method == "crc" else 0.1
    if args.method == "crc" and args.delta is not None:
        raise FolderError("--delta belongs to --method rcps or ltt; CRC controls the expected loss")
    return ConformalSettings(alpha=args.alpha, delta=delta, method=args.method, loss=args.loss, absent=args.absent,
                             rcps_bound=args.rcps_bound, fwer=args.fwer, tau=args.tau, classes=classes)


def summarise_fit(owners: dict[str, PredictionFormat], reference: Reference, settings: ConformalSettings,
                  thresholds, workers: int = 1) -> tuple[CaseSummary, list[Path]]:
    """Every fit case read once and summarised (counts on the grid, margins), in ``workers`` processes
    (:mod:`mcseg.evaluation.case_pool`; stacked in case order); the files read."""
    summaries, read = [], []
    job = partial(_summarise_case, owners, reference, settings, thresholds)
    for summary, files in map_cases(job, list(owners), workers, desc="summarising fit cases"):
        summaries.append(summary)
        read += files
    return CaseSummary.stack(summaries), read


def _summarise_case(owners: dict[str, PredictionFormat], reference: Reference, settings: ConformalSettings,
                    thresholds, case: str) -> tuple[CaseSummary, list[Path]]:
    """One fit case of :func:`summarise_fit`: its summary, the files read."""
    task, folder = reference.task, owners[case]
    label_vol, label, probs, prediction, files = read_case([folder], reference, case)
    if probs is None:
        raise FolderError(f"case {case}: {folder.path} has label maps only; a conformal fit needs probabilities")
    truth = class_masks(label, task.channels, task.multilabel)
    pred = predicted_masks(probs, task.multilabel, prediction)
    return summarise(case, probs, truth, pred, label_vol.spacing, thresholds, settings.tau, settings.classes), files


def _image(images: Path, case: str, shape: tuple[int, ...]) -> np.ndarray:
    """A case's image (first channel) from ``images``, checked against the prediction's grid."""
    path = image_path(images, case)
    array = np.asarray(read_volume(path).array, np.float32)
    array = array[..., 0] if array.ndim == len(shape) + 1 else array
    if array.shape != tuple(shape):
        raise FolderError(f"--images {path.name} has shape {array.shape}, the prediction {tuple(shape)}")
    return array


def case_figure(case: str, probs, sets: dict, pred: np.ndarray, truth: np.ndarray | None, names: list[str],
                images: Path | None, out: Path) -> str:
    """``<case>_conformal.png`` (:func:`mcseg.conformal.plots.case_overlay`, over the image of ``images`` where
    given); its name."""
    from mcseg.conformal.plots import case_overlay

    name = f"{case}_conformal.png"
    case_overlay(out / name, case, probs, sets, pred, truth, names,
                 _image(images, case, pred.shape[1:]) if images is not None else None)
    return name


def apply_folder(target: PredictionFormat, reference: Reference, settings: ConformalSettings, thresholds: dict,
                 margins: dict, out: Path, images: Path | None = None, figures: bool = False,
                 summary_grid=None, workers: int = 1) -> tuple[list[str], list[dict], list[Path], list[CaseSummary]]:
    """Each test case's masks (and with ``figures`` its overlay) written to ``out``; its per-class test rows;
    the files read; with ``summary_grid`` (a threshold grid) the labelled cases' summaries (:func:`summarise`, as
    the fit cases'). The cases in ``workers`` processes (:mod:`mcseg.evaluation.case_pool`; merged in case order)."""
    written, rows, read, tested = [], [], [], []
    job = partial(_apply_case, target, reference, settings, thresholds, margins, out, images, figures, summary_grid)
    for files, case_rows, case_read, summary in map_cases(job, target.cases(), workers, desc="applying"):
        written += files
        rows += case_rows
        read += case_read
        tested += [summary] if summary is not None else []
    return written, rows, read, tested


def _apply_case(target: PredictionFormat, reference: Reference, settings: ConformalSettings, thresholds: dict,
                margins: dict, out: Path, images: Path | None, figures: bool, summary_grid,
                case: str) -> tuple[list[str], list[dict], list[Path], CaseSummary | None]:
    """One test case of :func:`apply_folder`: the files written, its rows, the files read, its summary (labelled,
    with ``summary_grid``) or None."""
    task, rows, tested = reference.task, [], None
    labelled = case in reference.labels
    if labelled:
        grid, label, probs, prediction, read = read_case([target], reference, case)
        source = reference.labels[case]
    else:  # checked by conformal(): --images gives its grid
        grid, source, probs, prediction, read = read_unlabelled(target, case, images)
    if probs is None:
        raise FolderError(f"case {case}: {target.path} has label maps only; sets need probabilities")
    pred = predicted_masks(probs, task.multilabel, prediction)
    sets = case_sets(probs, pred, grid.spacing, thresholds, margins)
    truth = class_masks(label, task.channels, task.multilabel).numpy() if labelled else None
    if labelled:
        for k, result in case_test(sets, truth, pred, settings.loss, settings.tau).items():
            rows.append({"case": case, "class": task.class_names[k], **result})
        if summary_grid is not None:
            tested = summarise(case, probs, torch.from_numpy(truth), pred, grid.spacing, summary_grid, settings.tau,
                               settings.classes)
    written = write_masks(out, case, sets, task.class_names, grid.affine, source)
    if figures:
        written.append(case_figure(case, probs, sets, pred, truth, task.class_names, images, out))
    return written, rows, read, tested


def _earlier_files(out: Path) -> tuple[str, ...]:
    """What an earlier conformal fit of ``out`` wrote (its conformal.json, masks and per_case.csv)."""
    try:
        stored = json.loads((out / CONFORMAL_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return ()
    return (CONFORMAL_FILE, "per_case.csv", VALIDITY_FILE, COVERAGE_FIGURE,
            *((stored.get("applied") or {}).get("files") or []))


def _refuse_fit_cases(target: PredictionFormat, fit_cases: Sequence[str]) -> None:
    both = sorted(set(target.cases()) & set(fit_cases))
    if both:
        raise FolderError(f"--apply {target.path} holds {len(both)} calibration case(s) ({', '.join(both[:10])}): "
                          f"the guarantee is for new cases exchangeable with the calibration cases; pass --apply a "
                          f"folder of other cases (or --splits/--fold to fit on a fold's validation cases only)")


def conformal(args: argparse.Namespace) -> dict:
    """Fit, apply and record (module docstring); returns the record written to conformal.json."""
    check_workers(args.workers)
    out = args.output_dir.resolve()
    if args.repeats < 0 or any(not 0 < a < 1 for a in args.alphas):
        raise FolderError(f"--repeats {args.repeats} --alphas {' '.join(map(str, args.alphas))}: expected repeats >= "
                          f"0 and each alpha in (0, 1)")
    try:  # from the command line alone: refused before any folder is read
        controllable(args.loss, args.method)
    except NotMonotone as exc:
        raise FolderError(f"--loss {args.loss} with --method {args.method}: {exc}") from None
    if args.dicom:
        if not args.apply:
            raise FolderError("--dicom writes the --apply cases' masks as DICOM: pass --apply")
        dicom_modules()  # highdicom and pydicom there, before anything is written
    if args.images is not None and not args.apply:
        raise FolderError("--images gives the --apply cases' grid (and the background of --figures): pass --apply")
    inputs = [d.resolve() for d in [*args.fit, *([args.apply] if args.apply else [])]]
    if out in inputs:
        raise FolderError(f"-o {args.output_dir}: write the conformal fit to a new folder, not an input folder")
    earlier = claim_output(args.output_dir, CONFORMAL_TOOL, args.overwrite,
                           lambda folder: prediction_files(folder, monai_postfix=args.monai_postfix))
    reference = read_reference(args.reference, args.class_names, args.num_classes, args.dataset_json,
                               declared=declared_classes(args.fit[0]))
    settings = settings_of(args, reference)
    fit = [open_folder(d, reference.task, args.fmt, args.monai_postfix) for d in args.fit]
    if (args.splits is None) != (args.fold is None):
        raise FolderError("--splits and --fold go together")
    owners = _fit_owners(fit, fold_cases(args.splits, args.fold) if args.splits else None)
    unlabelled = [c for c in owners if c not in reference.labels]
    if unlabelled:
        raise FolderError(f"{len(unlabelled)} fit case(s) without a label in {reference.root}: "
                          f"{', '.join(unlabelled[:10])}")
    target = open_folder(args.apply, reference.task, args.fmt, args.monai_postfix) if args.apply else None
    if target is not None:
        _refuse_fit_cases(target, list(owners))
        untested = [c for c in target.cases() if c not in reference.labels]
        if untested and args.images is None:
            raise FolderError(f"{len(untested)} --apply case(s) without a label in {reference.root} "
                              f"({', '.join(untested[:10])}): pass --images (their images, whose grid the files are "
                              f"checked against), or a reference with their labels")
    grid = default_thresholds(args.grid_size)
    record = {"fit": [str(d.resolve()) for d in args.fit], "apply": str(args.apply.resolve()) if args.apply else None}
    with writing(out, CONFORMAL_TOOL, record, _earlier_files(out) if earlier is not None else ()):
        summaries, read = summarise_fit(owners, reference, settings, grid, args.workers)
        thresholds = fit_thresholds(summaries, settings)
        margins = fit_margins(summaries, settings)
        stored = _record(args, reference, settings, summaries, thresholds, margins, fit, read)
        if target is not None:
            files, rows, applied_read, tested = apply_folder(target, reference, settings, thresholds, margins, out,
                                                             args.images, args.figures,
                                                             grid if args.repeats else None, args.workers)
            if rows:
                write_csv(out / "per_case.csv", rows)
            stored["applied"] = {"to": str(Path(target.path).resolve()), "format": target.format,
                                 "cases": target.cases(), "files": files,
                                 "cases_without_label": [c for c in target.cases() if c not in reference.labels],
                                 "input_files_sha256": {str(p.resolve()): file_sha256(p)
                                                        for p in dict.fromkeys(applied_read)}}
            stored["test"] = test_figures(rows, settings)
            if tested:  # the fit and the labelled test cases pooled and split again (docs/conformal.md)
                stored["validity"], _ = pooled_splits(summaries, CaseSummary.stack(tested), settings,
                                                      reference.task.class_names, levels(args.alphas, args.alpha),
                                                      args.repeats, out)
            if args.dicom:
                stored["dicom"] = [str(p.relative_to(out)) for p in conformal_to_dicom(out, stored, reference,
                                                                                       args.images)]
        write_json(out / CONFORMAL_FILE, stored)
        stored["report"] = command_report(args, out, reference, args.images)
    return stored


def _record(args, reference: Reference, settings: ConformalSettings, summaries: CaseSummary, thresholds: dict,
            margins: dict, fit: list[PredictionFormat], read: list[Path]) -> dict:
    """conformal.json before the test folder: settings, per class the threshold and margins, provenance."""
    files = [*reference.files, *dict.fromkeys(f for folder in fit for f in folder.config_files()), *read]
    return {"tool": CONFORMAL_TOOL, **settings_record(settings, summaries),
            "sets": "{v : p_k(v) >= t_k}, p the saved probabilities (softmax channel or region sigmoid)",
            "classes": class_records(settings, thresholds, margins, reference.task.class_names),
            "fit_cases": summaries.cases,
            "provenance": {"predictions": [f.identity() for f in fit],
                           "reference": {"path": str(reference.root.resolve()), "kind": reference.kind},
                           "input_files_sha256": {str(p.resolve()): file_sha256(p) for p in dict.fromkeys(files)},
                           "versions": versions()}}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code, stored = run_command(CONFORMAL_TOOL, lambda: conformal(args))
    if code:
        return code
    print("\n".join(fit_lines(stored)))
    print(f"recorded in {args.output_dir / CONFORMAL_FILE}")
    if stored.get("report"):
        print(f"report: {stored['report']}")
    if stored.get("dicom"):
        print(f"{len(stored['dicom'])} DICOM object(s) written to {args.output_dir / 'dicom'} (viewers: "
              f"docs/report_html.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

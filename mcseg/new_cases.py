"""``mcseg-new-cases --fit VAL_DIR [...] --reference REF --apply NEW_DIR [--images IMAGES] -o OUT_DIR``

Statements for new cases without labels, with guarantees from labelled calibration cases (:mod:`mcseg.statements`;
docs/new_cases.md): per case and structure the volume in mL with a split-conformal interval, a lower bound on the
Dice and an upper bound on the HD95, and per case a review flag chosen by Learn-then-Test; with ``--shift weighted``
the intervals are weighted by density ratios between the calibration and the new cases (covariate shift).

Fitted on the cases of validation prediction folders (nnU-Net's out-of-fold ``fold_k/validation``, a MONAI or mcseg
folder, or the validation cases of ``--splits --fold``) against their labels; applied to the cases of ``--apply``,
whose grid comes from their images (``--images``) or, where the reference holds their labels, from those: such
labels are used only to measure what the statements achieve (``*_true``, ``*_covered`` columns), never to fit.
With ``--fit-members`` and ``--apply-members`` (each member of an ensemble, TTA or MC dropout saved as its own
prediction folder, holding every calibration / new case) the normalised volume interval is also given with the
members' spread as its scale (statement ``volume_members``).
Writes ``OUT_DIR/statements.csv`` (one row per case and structure), ``statements.json`` (the guarantees and the
rows), ``calibration_cases.csv`` and ``new_cases.csv`` (the per-case figures everything is computed from), under
:mod:`mcseg.evaluation.folder_outputs`' rule (never another tool's folder; an earlier one only with ``--overwrite``).
``--workers N`` reads the cases in N processes (:mod:`mcseg.evaluation.case_pool`; the same files as one).
"""
from __future__ import annotations

import argparse
import math
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch

from mcseg.conformal import predicted_masks
from mcseg.conformal.fit import class_indices
from mcseg.conformal.risks import class_masks
from mcseg.data.io import read_volume
from mcseg.data.reference import FolderError, Reference, fold_cases, read_reference
from mcseg.evaluation.case_pool import check_workers, map_cases
from mcseg.evaluation.folder_options import add_fit_apply_options, add_input_options, add_workers_option
from mcseg.evaluation.folder_outputs import NEW_CASES_TOOL, claim_output, run_command, writing
from mcseg.evaluation.folder_posthoc import _fit_owners
from mcseg.evaluation.folders import image_path, read_case, read_unlabelled
from mcseg.evaluation.formats import PredictionFormat, declared_classes, open_folder, prediction_files
from mcseg.evaluation.provenance import file_sha256
from mcseg.report.folder_report import add_html_options, command_report
from mcseg.statements.features import MEMBERS, case_row, members_volume_sd
from mcseg.statements.review import PROCEDURES
from mcseg.statements.shift import case_vector, density_ratio_weights, image_statistics
from mcseg.statements.statements import OUTPUTS, StatementSettings, make_statements, write_statements
from mcseg.statements.table import CaseTable

__all__ = ["main", "new_cases"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=NEW_CASES_TOOL,
        description="Per new case and structure: the volume in mL with a conformal interval, a lower bound on the "
                    "Dice and an upper bound on the HD95, and a review flag with a Learn-then-Test guarantee, "
                    "fitted on labelled validation predictions of nnU-Net, MONAI or mcseg (docs/new_cases.md).")
    add_fit_apply_options(
        p, fit="validation prediction folders holding different cases (e.g. nnU-Net's fold_k/validation)",
        reference="the calibration cases' labels: an nnU-Net raw dataset, an MSD folder or <case>.nii.gz",
        apply="the new cases' prediction folder (probabilities; labels are not needed)",
        output="where statements.csv and statements.json go: a new folder (an earlier one only with --overwrite)",
        overwrite="replace earlier statements in OUT_DIR")
    p.add_argument("--images", type=Path, help="the new cases' images (<case>_0000.nii.gz or <case>.nii.gz): their "
                   "grid, and with --shift weighted their intensity statistics; needed for cases without a label")
    p.add_argument("--fit-images", type=Path, help="the calibration cases' images: with --images and --shift "
                   "weighted, intensity statistics join the case features")
    p.add_argument("--alpha", type=float, default=0.1, help="miscoverage: statements hold with probability >= "
                   "1 - alpha (default 0.1)")
    p.add_argument("--delta", type=float, default=0.1, help="the review rule's failure probability (default 0.1)")
    p.add_argument("--floor", type=float, default=0.7, help="a structure with Dice below this is a failure (the "
                   "review flag's clinical floor; default 0.7)")
    p.add_argument("--procedure", choices=PROCEDURES, default="fixed_sequence", help="the review rule's multiple "
                   "testing (default fixed_sequence, strict to loose)")
    p.add_argument("--shift", choices=("none", "weighted"), default="none", help="weighted: weighted conformal "
                   "intervals with density-ratio weights from a cross-fitted classifier (needs >= 10 new cases)")
    p.add_argument("--fit-members", nargs="+", type=Path, metavar="MEMBER_DIR", help="the members of the "
                   "calibration predictions (an ensemble's networks, TTA views or MC-dropout samples), one prediction "
                   "folder each, every calibration case in each: the volume interval with the members' spread as "
                   "its scale (volume_members); with --apply-members")
    p.add_argument("--apply-members", nargs="+", type=Path, metavar="MEMBER_DIR", help="the same members' "
                   "folders for the new cases (as many, in the same order, as --fit-members)")
    p.add_argument("--classes", nargs="+", help="structures (class names; default every class but the background)")
    p.add_argument("--figure", action="store_true", help="also statements.png: per structure the cases' volume "
                   "intervals, flagged cases in red, true volumes where the new cases' labels were given")
    add_workers_option(p, "read the calibration and new cases (their figures, members, image statistics)")
    add_html_options(p)
    add_input_options(p)
    return p


def _figures(probs: torch.Tensor | None, prediction, spacing, classes: list[int], multilabel: bool, where: str,
             truth: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """One case's row of the table (:func:`mcseg.statements.features.case_row`); label maps alone refused."""
    if probs is None:
        raise FolderError(f"{where} holds a label map without probabilities: volumes with intervals and quality "
                          f"bounds need the probabilities (nnU-Net: --save_probabilities; MONAI/mcseg: the "
                          f"probability maps), not a mask")
    pred = predicted_masks(probs, multilabel, prediction)
    masks = class_masks(truth, probs.shape[0], multilabel).numpy() if truth is not None else None
    return case_row(probs, pred, spacing, classes, masks)


def _image_stats(images: Path | None, case: str) -> np.ndarray | None:
    if images is None:
        return None
    array = np.asarray(read_volume(image_path(images, case)).array, np.float64)
    return image_statistics(array)


def _member_spread(members: list[PredictionFormat], reference: Reference, images: Path | None, case: str,
                   spacing, classes: list[int]) -> tuple[np.ndarray, list[Path]]:
    """The case's ``volume_members_sd_ml`` (:func:`~mcseg.statements.features.members_volume_sd`) from each
    member folder's mask (its label map, else the arg-max / p > 0.5 of its probabilities), read against the
    case's label (or image) grid; the files read."""
    task, masks, read = reference.task, [], []
    for member in members:
        if case not in member.files:
            raise FolderError(f"member folder {member.path} has no prediction of case {case}: each member folder "
                              f"must hold every case it is given for")
        if case in reference.labels:
            _, _, probs, prediction, files = read_case([member], reference, case)
        else:
            _, _, probs, prediction, files = read_unlabelled(member, case, images)
        masks.append(class_masks(prediction, task.channels, task.multilabel).numpy() if probs is None else
                     predicted_masks(probs, task.multilabel, prediction))
        read += files
    return members_volume_sd(masks, spacing, classes), read


def read_calibration(owners: dict[str, PredictionFormat], reference: Reference, classes: list[int],
                     names: list[str], members: list[PredictionFormat] = (),
                     workers: int = 1) -> tuple[CaseTable, list[Path]]:
    """The calibration cases' table (label-free figures and the truth), read in ``workers`` processes
    (:mod:`mcseg.evaluation.case_pool`; in case order); the files read."""
    job = partial(_table_row, owners, reference, None, classes, list(members), True)
    return _table(job, list(owners), names, workers)


def read_new(target: PredictionFormat, reference: Reference, images: Path | None, classes: list[int],
             names: list[str], members: list[PredictionFormat] = (),
             workers: int = 1) -> tuple[CaseTable, list[Path]]:
    """The new cases' table: label-free figures, and the truth where the reference has every case's label; read
    in ``workers`` processes as :func:`read_calibration`."""
    cases = target.cases()
    labelled = all(c in reference.labels for c in cases)
    job = partial(_table_row, dict.fromkeys(cases, target), reference, images, classes, list(members), labelled)
    return _table(job, cases, names, workers)


def _table(job, cases: list[str], names: list[str], workers: int) -> tuple[CaseTable, list[Path]]:
    rows, read = [], []
    for row, files in map_cases(job, cases, workers, desc="reading cases"):
        rows.append(row)
        read += files
    return CaseTable.from_rows(cases, names, rows), read


def _table_row(owners: dict[str, PredictionFormat], reference: Reference, images: Path | None, classes: list[int],
               members: list[PredictionFormat], labelled: bool, case: str) -> tuple[dict, list[Path]]:
    """One case's row of a table (:func:`_figures`, and the members' spread where there are members) from the
    folder ``owners[case]``, on its label's grid (``labelled``: with the truth), else on its image's from
    ``images``; the files read."""
    folder = owners[case]
    if labelled:
        grid, label, probs, prediction, read = read_case([folder], reference, case)
    else:
        grid, _, probs, prediction, read = read_unlabelled(folder, case, images)
        label = None
    row = _figures(probs, prediction, grid.spacing, classes, reference.task.multilabel, f"{folder.path} (case {case})",
                   label)
    if members:
        row[MEMBERS], more = _member_spread(members, reference, None if labelled else images, case, grid.spacing,
                                            classes)
        read = [*read, *more]
    return row, read


def _check(args: argparse.Namespace) -> None:
    check_workers(args.workers)
    StatementSettings(args.alpha, args.delta, args.floor, args.procedure)
    if args.apply is None:
        raise FolderError("--apply NEW_DIR: the new cases' predictions are what the statements are about")
    if (args.splits is None) != (args.fold is None):
        raise FolderError("--splits and --fold go together")
    out = args.output_dir.resolve()
    if out in [d.resolve() for d in [*args.fit, args.apply]]:
        raise FolderError(f"-o {args.output_dir}: write the statements to a new folder, not an input folder")
    if args.fit_images is not None and (args.images is None or args.shift != "weighted"):
        raise FolderError("--fit-images adds intensity statistics to the weighted statements' case features: pass "
                          "it with --images and --shift weighted")
    fit_members, apply_members = args.fit_members or [], args.apply_members or []
    if bool(fit_members) != bool(apply_members):
        given, absent = ("--fit-members", "--apply-members") if fit_members else ("--apply-members", "--fit-members")
        raise FolderError(f"{given} without {absent}: the members' spread scales the interval only when both the "
                          f"calibration and the new cases have members (pass {absent} MEMBER_DIR ...)")
    for option, folders in (("--fit-members", fit_members), ("--apply-members", apply_members)):
        if folders and len(folders) < 2:
            raise FolderError(f"{option} {folders[0]}: one member has no spread; give the members' folders, at "
                              f"least two")
        if len({d.resolve() for d in folders}) < len(folders):
            raise FolderError(f"{option}: a member folder is listed twice; list each member once")
    if fit_members and len(fit_members) != len(apply_members):
        raise FolderError(f"--fit-members has {len(fit_members)} folders, --apply-members {len(apply_members)}: the "
                          f"same members must predict the calibration and the new cases")


def new_cases(args: argparse.Namespace) -> dict:
    """Read, fit, apply and write (module docstring); returns the record written to statements.json."""
    _check(args)
    settings = StatementSettings(args.alpha, args.delta, args.floor, args.procedure)
    earlier = claim_output(args.output_dir, NEW_CASES_TOOL, args.overwrite,
                           lambda folder: prediction_files(folder, monai_postfix=args.monai_postfix))
    reference = read_reference(args.reference, args.class_names, args.num_classes, args.dataset_json,
                               declared=declared_classes(args.fit[0]))
    task = reference.task
    try:
        classes = class_indices(args.classes, task.class_names, task.multilabel)
    except ValueError as exc:
        raise FolderError(f"--classes: {exc}") from None
    names = [task.class_names[k] for k in classes]
    fit = [open_folder(d, task, args.fmt, args.monai_postfix) for d in args.fit]
    owners = _fit_owners(fit, fold_cases(args.splits, args.fold) if args.splits else None)
    unlabelled = [c for c in owners if c not in reference.labels]
    if unlabelled:
        raise FolderError(f"{len(unlabelled)} calibration case(s) without a label in {reference.root}: "
                          f"{', '.join(unlabelled[:10])}")
    target = open_folder(args.apply, task, args.fmt, args.monai_postfix)
    both = sorted(set(target.cases()) & set(owners))
    if both:
        raise FolderError(f"--apply {target.path} holds {len(both)} calibration case(s) ({', '.join(both[:10])}): no "
                          f"guarantee covers a case that calibrated it; pass --apply a folder of new cases only")
    if not all(c in reference.labels for c in target.cases()) and args.images is None:
        raise FolderError(f"--apply {target.path}: cases without a label in {reference.root} need --images (their "
                          f"images: the grid the predictions are checked against)")
    members = {option: [open_folder(d, task, args.fmt, args.monai_postfix) for d in folders or []]
               for option, folders in (("fit", args.fit_members), ("apply", args.apply_members))}
    calibration, read = read_calibration(owners, reference, classes, names, members["fit"], args.workers)
    new, new_read = read_new(target, reference, args.images, classes, names, members["apply"], args.workers)
    weights = None
    if args.shift == "weighted":
        stats = (lambda folder, cases: np.stack(list(map_cases(partial(_image_stats, folder), cases, args.workers,
                                                               desc="image statistics")))
                 if args.fit_images is not None else None)
        weights = density_ratio_weights(case_vector(calibration, stats(args.fit_images, calibration.cases)),
                                        case_vector(new.unlabelled(), stats(args.images, new.cases)))
    rows, record = make_statements(calibration, new, settings, weights)
    out = args.output_dir
    status = {"fit": [str(d.resolve()) for d in args.fit], "apply": str(args.apply.resolve())}
    files = [*reference.files, *read, *new_read]
    record = {"tool": NEW_CASES_TOOL, **record, "classes": names,
              "calibration_cases": calibration.cases, "new_cases": new.cases,
              "members": ({option: [str(f.path.resolve()) for f in folders] for option, folders in members.items()}
                          if members["fit"] else "none: the normalised volume interval's scale is the "
                          "Poisson-binomial sd only"),
              "provenance": {"fit": [f.identity() for f in fit], "apply": target.identity(),
                             "reference": {"path": str(reference.root.resolve()), "kind": reference.kind},
                             "input_files_sha256": {str(p.resolve()): file_sha256(p) for p in dict.fromkeys(files)}},
              "rows": rows}
    with writing(out, NEW_CASES_TOOL, status, (*OUTPUTS, "statements.png") if earlier is not None else ()):
        write_statements(out, calibration, new, rows, record, figure=args.figure)
        page = command_report(args, out, reference, args.images)
    return {**record, "report": page}


def _number(value: float, digits: int = 2) -> str:
    return "inf" if math.isinf(value) else f"{value:.{digits}f}"


def summary_lines(record: dict) -> list[str]:
    """The short table printed after a run: per case and structure the volume and its interval, the bounds and
    the flag; then the guarantee."""
    lines = [f"{'case':<24} {'structure':<12} {'volume mL [interval]':<28} {'Dice >=':>8} {'HD95 <= mm':>10}  review"]
    for row in record["rows"]:
        interval = f"{_number(row['volume_mask_ml'])} [{_number(row['volume_lower_ml'])}, " \
                   f"{_number(row['volume_upper_ml'])}]"
        lines.append(f"{row['case']:<24} {row['structure']:<12} {interval:<28} {_number(row['dice_lower']):>8} "
                     f"{_number(row['hd95_upper_mm'], 1):>10}  {'FLAG' if row['review'] else 'ok'}")
    review = record["review"]
    lines.append(f"guarantee: each statement holds with probability >= {record['level']:.3g} ({record['method']}; "
                 f"n = {record['n_calibration_cases']} calibration cases; assumption: {record['assumption']})")
    rule = ("flag every case" if not review["certified"] else
            f"flag when u > {review['threshold']:.3g}" if review["threshold"] < 1 else
            "flag no case (u <= 1 always: even accepting every case is certified)")
    lines.append(f"review: {rule} (failure: {review['failure']}; {review['guarantee']}; {review['reason']}); "
                 f"{review['flagged_new']} of {review['n_new']} new case(s) flagged")
    if "warning" in record:
        lines.append(f"warning: {record['warning']}")
    if "shift" in record:
        lines.append(f"shift: effective sample size {record['shift']['n_eff']:.1f} of {record['n_calibration_cases']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code, record = run_command(NEW_CASES_TOOL, lambda: new_cases(args))
    if code:
        return code
    print("\n".join(summary_lines(record)))
    print(f"written: {args.output_dir / 'statements.csv'}, {args.output_dir / 'statements.json'}"
          + (f", {record['report']}" if record.get("report") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

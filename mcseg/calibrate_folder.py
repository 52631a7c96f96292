"""``mcseg-calibrate-folder --fit VAL_DIR [...] --reference REF --apply TEST_DIR -o OUT_DIR``

Post-hoc calibration of another tool's saved probabilities (:mod:`mcseg.evaluation.folder_posthoc`): a
scaler of :data:`~mcseg.calibration.scaler_registry.SCALER_TYPES` (a temperature by default; vector scaling, histogram
binning, isotonic regression, Fiducio's calibrators; local temperature scaling on the log-probabilities, without the
image) is fitted on validation prediction folders (nnU-Net's ``fold_k/validation``
folders written with ``--npz``: together every training case once, out of fold; or any folder, or the
validation cases of ``--splits splits_final.json --fold K``), recorded in ``OUT_DIR/calibration.json`` as mcseg
records its fits, and applied to the test folder, written to ``OUT_DIR`` in the tool's own format (nnU-Net:
npz + pkl copied + label map re-derived as nnU-Net does, plans.json and dataset.json copied), so that nnU-Net's
own tools read it. ``--apply`` may be left out (fit only). ``--workers N`` reads the fit cases and calibrates the
``--apply`` cases in N processes (:mod:`mcseg.evaluation.case_pool`; the same files as one).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcseg.calibration import PosthocConfig
from mcseg.calibration.posthoc_config import OBJECTIVES, VOXEL_SAMPLES
from mcseg.calibration.scaler_names import softmax_only_message
from mcseg.calibration.scaler_registry import SCALER_TYPES
from mcseg.data.io import VolumeError
from mcseg.config import EvalProtocol
from mcseg.evaluation.dicom import dicom_modules
from mcseg.evaluation.case_pool import check_workers
from mcseg.evaluation.folder_options import add_fit_apply_options, add_input_options, add_workers_option
from mcseg.evaluation.folder_outputs import CALIBRATE_TOOL, EXIT_INTERRUPTED, FolderInterrupted, claim_output, writing
from mcseg.evaluation.folder_posthoc import NO_IMAGE, calibrate_folder, fit_folders, record_applied, take_over
from mcseg.data.reference import FolderError, fold_cases, read_reference
from mcseg.evaluation.formats import PredictionFormat, declared_classes, open_folder, prediction_files
from mcseg.metrics.regions import REGIONS
from mcseg.evaluation.folder_dicom import calibrated_to_dicom
from mcseg.report.folder_report import add_html_options, command_report
from mcseg.rundir import RunDirBusy

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    defaults, posthoc = EvalProtocol(), PosthocConfig()
    p = argparse.ArgumentParser(
        prog="mcseg-calibrate-folder",
        description="Fit a post-hoc calibrator (a temperature by default; vector scaling, histogram binning, isotonic "
                    "regression, Fiducio's calibrators, local temperature scaling: --scaler) on saved validation "
                    "probabilities of nnU-Net, MONAI or mcseg and write the calibrated test probabilities in the "
                    f"tool's own format. Refused: {NO_IMAGE}.")
    add_fit_apply_options(
        p, fit="validation prediction folders (e.g. nnU-Net's fold_0/validation ... fold_4/validation)",
        reference="their labels: an nnU-Net raw dataset, an MSD folder or a folder of <case>.nii.gz",
        apply="the prediction folder to calibrate",
        output="where calibration.json and the calibrated files go: a new folder (never an input folder, a folder "
               "of predictions or an evaluation; an earlier calibration only with --overwrite)",
        overwrite="replace an earlier calibration in OUT_DIR (its calibration.json and the files it wrote; never a "
                  "folder of another tool's files)")
    p.add_argument("--allow-fit-cases", action="store_true", help="calibrate an --apply folder holding fit cases "
                   "(refused otherwise: their evaluation would score the cases the scaler was fitted on); "
                   "recorded in calibration.json and in the provenance of the calibrated folder's evaluation")
    p.add_argument("--scaler", default="temperature", choices=list(SCALER_TYPES),
                   help="the post-hoc scaler (mcseg.calibration.scaler_registry.SCALER_TYPES)")
    p.add_argument("--lts", nargs="+", default=[], metavar="KEY=VALUE", help="settings of --scaler lts (posthoc.lts "
                   "of a run, e.g. max_epochs=20 patch_size=[32,32,32]; default: 3D patches of 64^3)")
    p.add_argument("--histogram-bins", type=int, default=posthoc.histogram_bins,
                   help="equal-width bins of --scaler histogram / histogram_top")
    p.add_argument("--voxels", default=None, choices=VOXEL_SAMPLES,
                   help="fit voxels: the calibration region of --region, balanced or all; default: region for a "
                        "calibrator that keeps the arg-max, balanced for one that can move it (the region is picked "
                        "with the prediction it moves)")
    p.add_argument("--objective", default=posthoc.objective, choices=OBJECTIVES)
    p.add_argument("--max-voxels", type=int, default=posthoc.max_voxels)
    p.add_argument("--seed", type=int, default=posthoc.seed)
    p.add_argument("--region", choices=REGIONS, default=defaults.region, help="the calibration region (--voxels region)")
    p.add_argument("--n-bins", type=int, default=defaults.n_bins, help="ECE bins of --objective ece")
    p.add_argument("--dicom", action="store_true", help="also OUT_DIR/dicom/<case>/: the calibrated probabilities "
                   "as a DICOM FRACTIONAL / PROBABILITY Segmentation and the arg-max as a BINARY one, referencing the "
                   "case's image series (mcseg/evaluation/folder_dicom.py; docs/report_html.md)")
    p.add_argument("--images", type=Path, help="with --dicom: the cases' images (a DICOM series <case>/, or "
                   "<case>_0000.nii.gz / <case>.nii.gz; default: the reference's imagesTr / imagesTs); needed for "
                   "cases without a label")
    add_workers_option(p, "read the fit cases and calibrate the --apply cases")
    add_html_options(p)
    add_input_options(p, fold_use="fit on")
    return p


def calibrate(args: argparse.Namespace) -> tuple[dict, list[str]]:
    check_workers(args.workers)
    out = args.output_dir.resolve()
    if args.dicom:
        if args.apply is None:
            raise FolderError("--dicom writes the calibrated --apply cases as DICOM: pass --apply")
        dicom_modules()  # highdicom and pydicom there, before anything is written
    inputs = [d.resolve() for d in [*args.fit, *([args.apply] if args.apply else [])]]
    if out in inputs:
        raise FolderError(f"-o {args.output_dir}: write the calibrated files to a new folder, not an input folder")
    earlier = claim_output(args.output_dir, CALIBRATE_TOOL, args.overwrite,
                           lambda folder: prediction_files(folder, monai_postfix=args.monai_postfix))
    reference = read_reference(args.reference, args.class_names, args.num_classes, args.dataset_json,
                               declared=declared_classes(args.fit[0]))
    fit = [open_folder(d, reference.task, args.fmt, args.monai_postfix) for d in args.fit]
    if (args.splits is None) != (args.fold is None):
        raise FolderError("--splits and --fold go together")
    cases = fold_cases(args.splits, args.fold) if args.splits else None
    kind = SCALER_TYPES[args.scaler]
    if kind.softmax_only and reference.task.multilabel:
        raise FolderError(softmax_only_message(args.scaler, f"--scaler {args.scaler}"))
    voxels = args.voxels or default_voxels(args.scaler)
    if not kind.preserves_argmax and voxels == "region":
        raise FolderError(f"--voxels region: {args.scaler} scaling can change the arg-max, so the region it would be "
                          f"fitted on is not where it is scored; pass --voxels balanced or all")
    if args.objective not in kind.objectives:
        able = [name for name, other in SCALER_TYPES.items() if args.objective in other.objectives]
        raise FolderError(f"--objective {args.objective} fits {' or '.join(able)} only; {args.scaler} scaling is "
                          f"fitted by {' or '.join(o.upper() if o == 'nll' else o for o in kind.objectives)}")
    posthoc = PosthocConfig(fit=[args.scaler], apply=[args.scaler], max_voxels=args.max_voxels, seed=args.seed,
                            voxels=voxels, objective=args.objective, lts=_settings(args.lts, "--lts"),
                            histogram_bins=args.histogram_bins)
    protocol = EvalProtocol(region=args.region, n_bins=args.n_bins)
    target = open_folder(args.apply, reference.task, args.fmt, args.monai_postfix) if args.apply else None
    overlap = fit_cases_applied(args, fit, target, cases)
    with writing(out, CALIBRATE_TOOL, {"fit": [str(d.resolve()) for d in args.fit],
                                       "apply": str(args.apply.resolve()) if args.apply else None}):
        replaced = take_over(out) if earlier is not None else []
        record, scalers = fit_folders(fit, reference, out, [args.scaler], cases, posthoc, protocol, args.workers)
        files, changes = (calibrate_folder(target, scalers[args.scaler], out, reference.task.multilabel, args.workers)
                          if target else ([], None))
        stored = record_applied(out, record, args.scaler, target, files, record["val_cases"], replaced, changes)
        if args.dicom:
            calibrated = open_folder(out, reference.task, args.fmt, args.monai_postfix)
            record["dicom"] = calibrated_to_dicom(out, calibrated, reference, args.images)
        record["report"] = command_report(args, out, reference, args.images)
    record["applied"] = stored.get("applied")
    if overlap:
        record.setdefault("warnings", []).append(
            f"--apply {args.apply} {overlap} (--allow-fit-cases): an evaluation of {args.output_dir} that scores them "
            f"measures the fit itself, not calibration on unseen cases (recorded in calibration.json 'applied')")
    return record, target.cases() if target else []


def default_voxels(scaler: str) -> str:
    """The fit voxels of ``--scaler`` when ``--voxels`` is not given: the calibration region (where the ECE is
    scored) for a calibrator that keeps the arg-max, ``balanced`` for one that can move it (the region is picked with
    the prediction it moves, and voxels outside it, unseen by the fit, change class)."""
    return "region" if SCALER_TYPES[scaler].preserves_argmax else "balanced"


def _voxels_said(scaler: str) -> str:
    """The default of :func:`default_voxels` for ``scaler``, and why, in a line of the output."""
    keeps = SCALER_TYPES[scaler].preserves_argmax
    return (f"--voxels {default_voxels(scaler)} (the default for {scaler}, which "
            f"{'keeps the arg-max' if keeps else 'can move the arg-max: the region would move with it'}; "
            f"{'balanced' if keeps else 'region'} for one that {'can move' if keeps else 'keeps'} it; pass --voxels "
            f"to choose)")


def _settings(pairs: list[str], option: str) -> dict:
    """``KEY=VALUE`` words as a dict, each value read as YAML (numbers, lists, true/false)."""
    import yaml

    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise FolderError(f"{option} {pair}: expected KEY=VALUE")
        settings[key] = yaml.safe_load(value)
    return settings


def fit_cases_applied(args: argparse.Namespace, fit: list[PredictionFormat], target: PredictionFormat | None,
                      cases: list[str] | None) -> str | None:
    """What the --apply folder holds of the fit cases (``cases``, else every case of the ``fit`` folders), said
    in a phrase; refused unless --allow-fit-cases (an evaluation of the calibrated files would score the cases
    the scaler was fitted on). None when it holds none."""
    fit_cases = cases if cases is not None else sorted({c for folder in fit for c in folder.cases()})
    scored = sorted(set(fit_cases) & set(target.cases())) if target else []
    if not scored:
        return None
    listed = f"{len(scored)} of its cases are fit cases ({', '.join(scored[:10])})"
    overlap = (f"is also a --fit folder: {listed}" if args.apply.resolve() in [d.resolve() for d in args.fit] else
               f"holds cases the scaler is fitted on: {listed}")
    if not args.allow_fit_cases:
        raise FolderError(f"--apply {args.apply} {overlap}; an evaluation of the calibrated files would score the "
                          f"cases it was fitted on: pass --apply a folder of other cases (the test predictions), or "
                          f"--allow-fit-cases to calibrate them anyway (recorded in calibration.json and in the "
                          f"provenance of their evaluation)")
    return overlap


def _parameters(fitted: dict) -> str:
    """A fitted scaler's parameters in a phrase: T, or w and b, else where they are recorded."""
    if "temperature" in fitted:
        return f"T={fitted['temperature']:.4g}"
    if "weight" in fitted and "bias" in fitted:
        return f"w={[round(w, 4) for w in fitted['weight']]} b={[round(b, 4) for b in fitted['bias']]}"
    if "file" in fitted:  # a Fiducio calibrator: its own file, which fiducio.load_calibrator reads
        return f"({fitted.get('calibrator')}, keeps {fitted.get('guarantee')}, saved as {fitted['file']})"
    return "(parameters in calibration.json)"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        record, written = calibrate(args)
    except (FolderError, VolumeError, ValueError, RunDirBusy) as exc:
        print(f"mcseg-calibrate-folder: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(str(exc) if isinstance(exc, FolderInterrupted) else
              "mcseg-calibrate-folder: interrupted (Ctrl-C) before anything was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    fitted = record["scalers"][args.scaler]
    print(f"{args.scaler} {_parameters(fitted)} fitted on {record['n_cases']} case(s), {record['n_voxels']} voxels "
          f"({fitted.get('voxels')}); NLL {fitted['nll_before']:.5g} -> {fitted['nll_after']:.5g}; "
          f"recorded in {args.output_dir / 'calibration.json'}")
    if args.voxels is None and SCALER_TYPES[args.scaler].fitted_on == "voxels":
        print(_voxels_said(args.scaler))
    changes = fitted.get("argmax_changes")
    if changes:
        print(f"arg-max changed at {changes['count']} of {changes['of']} fit voxels ({100 * changes['share']:.2f} %)")
    applied = (record.get("applied") or {}).get("argmax_changes")
    if applied:
        print(f"arg-max changed at {applied['count']} of {applied['of']} voxels of the {len(written)} calibrated "
              f"case(s) ({100 * applied['share']:.2f} %)")
    for warning in record.get("warnings", []):
        print(f"warning: {warning}")
    if written:
        print(f"{len(written)} calibrated case(s) written to {args.output_dir}")
    if record.get("report"):
        print(f"report: {record['report']}")
    if record.get("dicom"):
        print(f"{len(record['dicom'])} DICOM object(s) written to {args.output_dir / 'dicom'} (viewers: "
              f"docs/report_html.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``mcseg-data``: validate a dataset folder before a long run, or fill its preprocessing cache.

    mcseg-data check dataset=acdc dataset.root=/data/ACDC/database [--workers 4] [--json report.json]
    mcseg-data prepare dataset=brats dataset.root=/data/BraTS2020 [--workers 8]

``check`` reads every file of every case (not the cache) and reports, per case, what is
wrong: a missing or unreadable label or image, a shape or affine mismatch between channels
and label (the rules training and evaluation also apply, :mod:`mcseg.data.validate`; an affine
mismatch is a warning with ``dataset.geometry_check=warn``, unchecked with ``off``), label
values outside the task's classes, NaN/inf intensities (errors); an empty label map or a
spacing far from the dataset's median (warnings). Then a summary: cases,
shapes, spacings, class frequencies. Exit status 1 when an error was found, 0 otherwise.
``prepare`` preprocesses every case into the cache (what a training run would do first).
Arguments other than options are Hydra overrides of the training config.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mcseg.data.cases import CaseRef, read_label_array
from mcseg.data.io import VolumeError, read_volume
from mcseg.data.validate import inspect_case
from mcseg.text import plural
from mcseg.runtime import helper_processes

SPACING_TOLERANCE = 2.0  # a case whose spacing differs from the median by more than this factor is odd


@dataclass
class CaseReport:
    case_id: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    shape: list[int] | None = None
    spacing: list[float] | None = None
    class_voxels: list[int] | None = None  # voxels per (mapped) label value


def check_case(dataset, ref: CaseRef) -> CaseReport:
    """Read every file of ``ref`` and collect what is wrong with it (never raises for bad data):
    the rules every run applies (:func:`~mcseg.data.validate.inspect_case`), then the voxels'. The label
    map of every rater of a multi-rater case is checked as a label is, and named by case and rater.
    Datasets whose cases are not one file each (a pickle of slices) are checked by reading the case."""
    if not getattr(dataset, "files_on_disk", True):
        return _check_by_reading(dataset, ref)
    found = inspect_case(dataset, ref, read=read_volume)
    report = CaseReport(ref.case_id, found.errors, found.warnings)
    if found.images:
        vol = found.images[0][1]
        report.shape, report.spacing = list(vol.spatial_shape), [float(s) for s in vol.spacing]
    for path, vol in found.images:
        finite = np.isfinite(vol.array) if np.issubdtype(vol.array.dtype, np.floating) else None
        if finite is not None and not finite.all():
            n_nan = int(np.isnan(vol.array).sum())
            n_inf = int((~finite).sum()) - n_nan
            report.errors.append(f"{path}: {n_nan} NaN and {n_inf} inf intensities")
    labels = [(found.label, ref.label_path)] if found.label is not None else []
    labels += [(vol, ref.rater_source(r)) for r, vol in enumerate(found.raters) if vol is not None]
    for vol, source in labels:
        try:
            label = read_label_array(vol.array, dataset.label_classes, source, dataset.label_mapping)
        except VolumeError as exc:
            report.errors.append(str(exc))
            continue
        _count(report, label, dataset.label_classes, source)
    return report


def _count(report: CaseReport, label: np.ndarray, n: int, source) -> None:
    """Add a (checked) label map's voxels per class to ``report``; warn when it is empty."""
    counts = np.bincount(np.asarray(label).ravel().astype(np.int64), minlength=n)
    report.class_voxels = [int(c) + (report.class_voxels[i] if report.class_voxels else 0)
                           for i, c in enumerate(counts)]
    if counts[1:].sum() == 0:
        report.warnings.append(f"{source}: label map is empty (background only)")


def _check_by_reading(dataset, ref: CaseRef) -> CaseReport:
    report = CaseReport(ref.case_id)
    try:
        case = dataset.read(ref)
    except (VolumeError, ValueError, OSError) as exc:
        report.errors.append(str(exc))
        return report
    report.shape, report.spacing = list(case.image.shape[1:]), [float(s) for s in case.spacing]
    if case.raters is not None:
        for r, rater in enumerate(case.raters):
            _count(report, rater, dataset.label_classes, ref.rater_source(r))
    elif case.label is not None:
        _count(report, case.label, dataset.label_classes, ref.case_id)
    return report


def _check_in_worker(args):
    dataset, ref = args
    return check_case(dataset, ref)


def spacing_outliers(reports: list[CaseReport], tolerance: float = SPACING_TOLERANCE) -> None:
    """Warn about cases whose spacing differs from the dataset median by more than ``tolerance`` times."""
    spacings = np.array([r.spacing for r in reports if r.spacing is not None], dtype=np.float64)
    if len(spacings) < 3:
        return
    median = np.median(spacings, axis=0)
    for r in reports:
        if r.spacing is None:
            continue
        ratio = np.asarray(r.spacing) / median
        if np.any(ratio > tolerance) or np.any(ratio < 1 / tolerance):
            r.warnings.append(f"spacing {tuple(round(s, 3) for s in r.spacing)} mm is far from the dataset median "
                              f"{tuple(round(float(s), 3) for s in median)} mm (more than {tolerance:g}x on an axis)")


def _range(values: np.ndarray) -> str:
    return " x ".join(f"{lo:g}-{med:g}-{hi:g}" for lo, med, hi in
                      zip(values.min(0), np.median(values, 0), values.max(0)))


def summarise(dataset, reports: list[CaseReport], problems: list[str]) -> dict:
    shapes = np.array([r.shape for r in reports if r.shape is not None])
    spacings = np.array([r.spacing for r in reports if r.spacing is not None])
    counted = [r.class_voxels for r in reports if r.class_voxels is not None]
    n = dataset.label_classes
    voxels = np.sum([c[:n] for c in counted], axis=0) if counted else np.zeros(n, dtype=np.int64)
    present = np.sum([[v > 0 for v in c[:n]] for c in counted], axis=0) if counted else np.zeros(n, dtype=int)
    names = list(dataset.class_names) if not dataset.multilabel else [f"label_{i}" for i in range(n)]
    total = max(int(voxels.sum()), 1)
    return {
        "dataset": dataset.name,
        "root": str(getattr(dataset, "root", "")),
        "cases": len(reports),
        "cases_with_errors": sum(1 for r in reports if r.errors),
        "cases_with_warnings": sum(1 for r in reports if r.warnings and not r.errors),
        "layout_errors": problems,
        "layout_warnings": list(getattr(dataset, "layout_warnings", [])),
        "shape_min_median_max": _range(shapes) if len(shapes) else None,
        "spacing_mm_min_median_max": _range(spacings) if len(spacings) else None,
        "classes": [
            {"value": i, "name": names[i] if i < len(names) else f"label_{i}", "voxel_share": float(voxels[i]) / total,
             "cases": int(present[i])}
            for i in range(n)
        ],
    }


def check_dataset(dataset, workers: int = 1, progress: bool = True,
                  spacing_tolerance: float = SPACING_TOLERANCE) -> tuple[list[CaseReport], dict]:
    """Check every case of ``dataset``; return the per-case reports and the summary."""
    from tqdm import tqdm

    try:
        try:
            refs, problems = dataset.scan()
        except NotImplementedError:  # datasets that only list cases (MSD)
            refs, problems = dataset.case_refs(), []
    except (ValueError, OSError) as exc:
        refs, problems = [], [str(exc)]
    if workers > 1 and len(refs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(workers, len(refs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            reports = list(tqdm(pool.map(_check_in_worker, [(dataset, r) for r in refs], chunksize=1),
                                total=len(refs), desc=f"checking {dataset.name}", disable=not progress))
    else:
        reports = [check_case(dataset, r) for r in tqdm(refs, desc=f"checking {dataset.name}", disable=not progress)]
    spacing_outliers(reports, spacing_tolerance)
    return reports, summarise(dataset, reports, problems)


def format_report(reports: list[CaseReport], summary: dict) -> str:
    lines = [f"mcseg-data check: dataset {summary['dataset']} at {summary['root']}: "
             f"{plural(summary['cases'], 'case')}"]
    lines += [f"ERROR   (layout) {p}" for p in summary["layout_errors"]]
    lines += [f"WARNING (layout) {p}" for p in summary["layout_warnings"]]
    for r in reports:
        lines += [f"ERROR   {r.case_id}: {e}" for e in r.errors]
        lines += [f"WARNING {r.case_id}: {w}" for w in r.warnings]
    lines.append(f"summary: {plural(summary['cases'], 'case')}, {summary['cases_with_errors']} with errors, "
                 f"{summary['cases_with_warnings']} with warnings only, "
                 f"{plural(len(summary['layout_errors']), 'layout error')}")
    lines.append(f"shapes (voxels, min-median-max per axis): {summary['shape_min_median_max']}")
    lines.append(f"spacings (mm, min-median-max per axis): {summary['spacing_mm_min_median_max']}")
    lines.append("classes (label values after the dataset's mapping): " + ", ".join(
        f"{c['value']} {c['name']} {100 * c['voxel_share']:.3g}% of voxels in {plural(c['cases'], 'case')}"
        for c in summary["classes"]))
    return "\n".join(lines)


def _build(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mcseg.config import CONFIG_DIR, check_target_keys
    from mcseg.data.build import build_dataset

    from omegaconf.errors import MissingMandatoryValue

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    check_target_keys(cfg.dataset, "dataset", ignore=("split", "sampling"))
    try:
        return build_dataset(cfg.dataset)
    except MissingMandatoryValue as exc:
        key = f"dataset.{exc.full_key}" if getattr(exc, "full_key", None) else "a dataset key"
        raise FileNotFoundError(f"{key} is not set: give {key}=... (e.g. dataset.root=/path/to/dataset)") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcseg-data", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("check", "prepare"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. dataset=acdc dataset.root=/data/ACDC/database")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: CPU cores - 1, at most 8)")
    parser.add_argument("--json", type=Path, default=None, help="also write the check report to this JSON file")
    parser.add_argument("--spacing-tolerance", type=float, default=SPACING_TOLERANCE,
                        help="warn when a spacing differs from the median by more than this factor")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    workers = args.workers if args.workers is not None else helper_processes()
    try:
        dataset = _build(args.overrides)
    except Exception as exc:  # a bad override, a missing root: one line, not a traceback
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        if not isinstance(exc, (ValueError, FileNotFoundError, HydraException, OmegaConfBaseException)) \
                or os.environ.get("MCSEG_TRACEBACK"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "prepare":
        try:
            n = dataset.prepare(dataset.case_refs(), workers=workers, progress=not args.no_progress)
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        where = dataset.cache.dir if dataset.cache is not None else "nowhere (no preprocessing step is on)"
        print(f"mcseg-data prepare: {plural(n, 'case')} preprocessed; cache {where}")
        return 0
    reports, summary = check_dataset(dataset, workers, progress=not args.no_progress,
                                     spacing_tolerance=args.spacing_tolerance)
    print(format_report(reports, summary))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "cases": [asdict(r) for r in reports]}, indent=1))
    return 1 if summary["cases_with_errors"] or summary["layout_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

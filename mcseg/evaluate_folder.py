"""``mcseg-evaluate-folder PRED_DIR REFERENCE [--format auto|nnunet|monai|mcseg] [--ensemble DIR ...]``

Evaluates a folder of predictions made by any tool against reference labels with mcseg's protocol
(docs/protocol.md, "Evaluating predictions made by another tool"): nnU-Net v2 ``--save_probabilities`` /
``--npz`` folders (npz + pkl + label map), MONAI ``SaveImage`` probability maps, mcseg's own ``<case>_probs``
(with ``--probs`` in another folder than the label maps ``<case>.nii.gz``), or label maps alone. The reference
is an nnU-Net raw dataset, an MSD folder or a folder of label maps; ``--splits splits_final.json --fold K``
evaluates the validation cases of fold K. Reading and checking: :mod:`mcseg.evaluation.formats`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from mcseg.data.io import VolumeError
from mcseg.config import EvalProtocol
from mcseg.evaluation.folder_options import add_workers_option
from mcseg.evaluation.folder_outputs import EXIT_INTERRUPTED, FolderInterrupted
from mcseg.runtime import keep_freed_memory
from mcseg.data.reference import FolderError, fold_cases, read_reference
from mcseg.evaluation.folders import evaluate_folders
from mcseg.evaluation.formats import declared_classes, format_names, open_folder
from mcseg.metrics.regions import REGIONS
from mcseg.metrics.surface import HD_DEFINITIONS
from mcseg.rundir import RunDirBusy

__all__ = ["FolderError", "evaluate_folder", "main"]


def _channels_hint(pred_dir: Path, probs_dir: Path | None) -> int | None:
    """The channel count of the first ``<case>_probs`` map (header only): a softmax's K when nothing else says."""
    import nibabel as nib

    folder = probs_dir or pred_dir
    first = next(iter(sorted(folder.glob("*_probs.nii*"))), None) if folder.is_dir() else None
    return int(nib.load(str(first)).shape[-1]) if first is not None else None


def evaluate_folder(pred_dir: Path, label_dir: Path, probs_dir: Path | None = None, num_classes: int | None = None,
                    class_names: list[str] | None = None, protocol: EvalProtocol | None = None,
                    output_dir: Path | None = None, allow_missing: bool = False, fmt: str = "auto",
                    ensemble: list[Path] | None = None, splits: Path | None = None, fold: str | None = None,
                    monai_postfix: str = "trans", dataset_json: Path | None = None, overwrite: bool = False,
                    workers: int = 1) -> dict:
    """Evaluate the predictions of ``pred_dir`` (pooled with those of ``ensemble``) against the reference
    ``label_dir``; write the outputs to ``output_dir`` (default ``pred_dir/eval``, ``pred_dir/eval-ensemble<M>``
    for an ensemble of M folders) and return the summary. An earlier evaluation there is replaced only with
    ``overwrite``; a folder of predictions is never written into (:mod:`mcseg.evaluation.folder_outputs`).
    ``workers`` processes read and score the cases (the same outputs as one: :mod:`mcseg.evaluation.case_pool`)."""
    protocol = protocol or EvalProtocol()
    pred_dir = Path(pred_dir)
    reference = read_reference(label_dir, class_names, num_classes, dataset_json,
                               channels_hint=_channels_hint(pred_dir, probs_dir), declared=declared_classes(pred_dir))
    folders = [open_folder(pred_dir, reference.task, fmt, monai_postfix, probs_dir)]
    folders += [open_folder(Path(d), reference.task, fmt, monai_postfix) for d in ensemble or []]
    if (splits is None) != (fold is None):
        raise FolderError("--splits and --fold go together (nnU-Net's splits_final.json and a fold, or 'all')")
    cases = fold_cases(splits, fold) if splits is not None else None
    selection = {"splits": str(Path(splits).resolve()), "fold": fold, "part": "val"} if splits is not None else None
    if selection is not None:
        from mcseg.evaluation.provenance import file_sha256

        selection["sha256"] = file_sha256(splits)
    out = output_folder(pred_dir, len(folders), output_dir)
    # mcseg's maps go beside its predictions; never into another tool's folder (its tools would read them as cases)
    uncertainty = (pred_dir if folders[0].format == "mcseg" and len(folders) == 1 else out / "uncertainty") \
        if protocol.save_uncertainty else None
    return evaluate_folders(folders, reference, protocol, out, cases, allow_missing, uncertainty, selection, overwrite,
                            workers)


def output_folder(pred_dir: Path, n_folders: int, output_dir: Path | None = None) -> Path:
    """Where an evaluation of ``n_folders`` prediction folders goes: ``output_dir``, else ``pred_dir/eval`` or
    ``pred_dir/eval-ensemble<M>``."""
    name = "eval" if n_folders == 1 else f"eval-ensemble{n_folders}"
    return Path(output_dir) if output_dir else Path(pred_dir) / name


def _parser() -> argparse.ArgumentParser:
    defaults = EvalProtocol()
    p = argparse.ArgumentParser(
        prog="mcseg-evaluate-folder",
        description="Evaluate a prediction folder (nnU-Net v2 npz + pkl + label map, MONAI SaveImage probability "
                    "maps, mcseg <case>_probs, or label maps alone) against reference labels: Dice, HD95 and ASSD "
                    "in mm, calibration (ECE, MCE, classwise and adaptive ECE, NLL, Brier), failure detection. "
                    "Writes per_case.csv, summary.json, provenance.json and reliability diagrams.")
    p.add_argument("pred_dir", type=Path, help="the prediction folder")
    p.add_argument("label_dir", type=Path, help="the reference: a folder of <case>.nii.gz labels, an nnU-Net raw "
                   "dataset (dataset.json, labelsTr) or an MSD folder")
    p.add_argument("--format", dest="fmt", default="auto", choices=("auto", *format_names()),
                   help="the prediction folder's format (default: detected; a stated one is checked)")
    p.add_argument("--ensemble", nargs="+", type=Path, default=[], metavar="DIR",
                   help="more prediction folders: their probabilities are averaged with PRED_DIR's (PE/EE/MI maps)")
    p.add_argument("--splits", type=Path, help="nnU-Net's splits_final.json: evaluate the validation cases of --fold")
    p.add_argument("--fold", help="a fold of --splits (0, 1, ...), or 'all' (every fold's validation cases)")
    p.add_argument("--monai-postfix", default="trans", help="SaveImage's output_postfix (default: trans)")
    p.add_argument("--dataset-json", type=Path, help="the dataset.json that gives the classes (default: the "
                   "reference's, or beside/above its labels)")
    p.add_argument("--probs", type=Path, dest="probs_dir", help="folder of mcseg's <case>_probs.nii.gz "
                   "(X x Y x Z x C), when PRED_DIR holds the label maps")
    p.add_argument("--num-classes", type=int, help="number of classes K of the task, background included "
                   "(default: dataset.json beside the labels, else the probability channels)")
    p.add_argument("--class-names", nargs="+", help="K class names, background first")
    p.add_argument("-o", "--output-dir", type=Path, help="where to write the results (default: PRED_DIR/eval); "
                   "never a folder of predictions, an earlier evaluation only with --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation in OUT_DIR (never "
                   "a folder of predictions or another tool's files)")
    p.add_argument("--dicom", action="store_true", help="also write each case as DICOM into OUT_DIR/dicom: the image "
                   "as a series, probabilities, prediction and uncertainty as Segmentations and a Parametric Map "
                   "(mcseg-dicom; docs/report_html.md)")
    p.add_argument("--images", type=Path, help="with --dicom: folder of the images (<case>.nii.gz or "
                   "<case>_0000.nii.gz; default: imagesTr beside the reference)")
    add_workers_option(p, "read and score the cases")
    p.add_argument("--allow-missing", action="store_true", help="evaluate even if some labels have no prediction")
    p.add_argument("--region", choices=REGIONS, default=defaults.region, help="voxels used for calibration")
    p.add_argument("--n-bins", type=int, default=defaults.n_bins)
    p.add_argument("--boundary-width-mm", type=float, default=defaults.boundary_width_mm)
    p.add_argument("--hd-percentile", type=float, default=defaults.hd_percentile)
    p.add_argument("--hd-definition", choices=HD_DEFINITIONS, default=defaults.hd_definition)
    p.add_argument("--bootstrap-samples", type=int, default=defaults.bootstrap_samples)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--no-failure-detection", dest="failure_detection", action="store_false",
                   help="leave the failure-detection section out")
    p.add_argument("--no-figures", dest="figures", action="store_false",
                   help="write reliability.csv and reliability_histogram.csv without their PNG figures")
    p.add_argument("--save-uncertainty", action="store_true",
                   help="write <case>_entropy.nii.gz (voxelwise entropy, nats) beside each mcseg prediction, into "
                        "OUT_DIR/uncertainty/ for other tools' folders and ensembles (these also "
                        "<case>_expected_entropy and <case>_mutual_information)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    keep_freed_memory()  # mcseg.runtime
    try:
        # the protocol's keys this command has options for
        protocol = EvalProtocol(**{f.name: getattr(args, f.name) for f in fields(EvalProtocol) if hasattr(args, f.name)})
        summary = evaluate_folder(args.pred_dir, args.label_dir, args.probs_dir, args.num_classes, args.class_names,
                                  protocol, args.output_dir, args.allow_missing, args.fmt, args.ensemble, args.splits,
                                  args.fold, args.monai_postfix, args.dataset_json, args.overwrite, args.workers)
    except (FolderError, VolumeError, ValueError, RunDirBusy) as exc:
        print(f"mcseg-evaluate-folder: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(str(exc) if isinstance(exc, FolderInterrupted) else
              "mcseg-evaluate-folder: interrupted (Ctrl-C) before anything was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    from mcseg.evaluation.split import format_summary

    for warning in (summary.get("provenance") or {}).get("warnings") or []:
        print(f"mcseg-evaluate-folder: warning: {warning}", file=sys.stderr)
    names = summary["classes"] if summary.get("multilabel") else ["background", *summary["classes"]]
    print(format_summary(summary, names, title=f"{args.pred_dir}"))
    if args.dicom:
        from mcseg.evaluation.dicom import DicomError
        from mcseg.evaluation.dicom_cases import export_evaluation

        out = output_folder(args.pred_dir, 1 + len(args.ensemble), args.output_dir)
        try:
            print(f"DICOM: {len(export_evaluation(out, summary, {}, args.images))} objects in {out / 'dicom'}")
        except (DicomError, OSError) as exc:
            print(f"mcseg-evaluate-folder: error: DICOM: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

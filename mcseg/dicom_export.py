"""``mcseg-dicom EVAL_DIR [--cases ID ...] [--images DIR] [--out DIR]``: an evaluation's outputs as DICOM.

For each case of an evaluation folder (``<run>/eval/<split>`` of ``evaluate.py``, or an ``mcseg-evaluate-folder``
output; default: every case of its per_case.csv), found as report.html finds them (:mod:`mcseg.evaluation.case_files`:
predictions, ``_probs``, ``_entropy``, conformal masks, and the image in ``--images`` or the dataset's folder):
``<out>/<case>/series/`` the image as a DICOM series (geometry from its NIfTI affine; none when the image is a
DICOM series ``--images/<case>/``, referenced as it is: :mod:`mcseg.evaluation.dicom_source`), and beside it the
probabilities (FRACTIONAL / PROBABILITY Segmentation), the prediction and the conformal sure / possible masks
(BINARY Segmentations) and the uncertainty (Parametric Map), all referencing that series
(:mod:`mcseg.evaluation.dicom`; viewers: docs/report_html.md). A case's folder appears complete or not at all:
it is written under ``<case>.partial`` and renamed at the end. Default ``--out``: ``EVAL_DIR/dicom``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mcseg.evaluation.dicom import DicomError
from mcseg.files import check_writable
from mcseg.evaluation.dicom_cases import evaluated_cases, export_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcseg-dicom", description=__doc__.split("\n")[0])
    parser.add_argument("eval_dir", type=Path, help="an evaluation folder (with summary.json and per_case.csv)")
    parser.add_argument("--cases", nargs="+", help="case ids (default: every case of per_case.csv)")
    parser.add_argument("--images", type=Path, help="folder of the images: <case>.nii.gz, <case>_0000.nii.gz, or a "
                        "DICOM series <case>/ (referenced as it is, no series written); default: the dataset's folder "
                        "recorded in summary.json")
    parser.add_argument("--out", type=Path, help="output folder (default: EVAL_DIR/dicom)")
    args = parser.parse_args(argv)
    summary_path = args.eval_dir / "summary.json"
    if not summary_path.is_file():
        print(f"error: {summary_path}: not found (an evaluation folder holds summary.json)", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    cases = args.cases or evaluated_cases(args.eval_dir)
    out = args.out or args.eval_dir / "dicom"
    try:
        check_writable(out)
        out.mkdir(parents=True, exist_ok=True)
        for case in cases:
            for path in export_case(args.eval_dir, summary, case, out, args.images):
                print(path)
    except (DicomError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which files of an evaluation show a case: report.html's per-case view (:mod:`mcseg.report.case_view`) and
the DICOM export (:mod:`mcseg.evaluation.dicom_cases`) read them.

For an evaluation (``<run>/eval/<split>/``, or the folder of an ``mcseg-evaluate-folder`` output) and a
case: the prediction ``predictions/<case>.nii.gz`` (else in the evaluated prediction folder), the probabilities
``<case>_probs.nii.gz`` and the uncertainty ``<case>_entropy.nii.gz`` beside it (written with
``inference.save_probabilities`` / ``evaluation.save_uncertainty``), the conformal masks
``conformal/<fit>/<case>_{sure,possible}_<class>.nii.gz`` (the first fit by name), and the image and label: in
``--images`` / ``--labels`` when given, else in the dataset's folder recorded in the summary's provenance
(``imagesTr``, ``imagesTs``, ``labelsTr``, ... of an MSD or nnU-Net layout; ``<case>.nii.gz`` or
``<case>_0000.nii.gz``), else in the evaluated reference folder.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


IMAGE_FOLDERS = ("imagesTr", "imagesTs", "images", "imagesVal")
LABEL_FOLDERS = ("labelsTr", "labelsTs", "labels", "labelsVal")
SUFFIXES = (".nii.gz", ".nii")


@dataclass
class CaseFiles:
    """The files of one case of one report row (None: not found)."""

    case: str
    source: str  # the row it is from, as the page names it
    dice: float
    prediction: Path | None = None
    probabilities: Path | None = None
    uncertainty: Path | None = None
    image: Path | None = None
    label: Path | None = None
    sure: list[Path] = field(default_factory=list)
    possible: list[Path] = field(default_factory=list)


def _first(folders: list[Path], names: list[str]) -> Path | None:
    for folder in folders:
        for name in names:
            for suffix in SUFFIXES:
                path = folder / f"{name}{suffix}"
                if path.is_file():
                    return path
    return None


def evaluation_folder(run, split: str) -> Path:
    """Where a report row's run wrote its evaluation: ``<run>/eval/<split>``, or the run's own folder for an
    evaluation of a prediction folder (its path holds ``per_case.csv``)."""
    own = Path(run.path) / "eval" / split
    return own if own.is_dir() or not (Path(run.path) / "per_case.csv").is_file() else Path(run.path)


def _recorded(summary: dict) -> tuple[list[Path], list[Path]]:
    """(prediction folders, data folders) the summary's provenance names: the evaluated prediction folders, and
    the dataset's root or the evaluated reference (with its image and label sub-folders)."""
    provenance = summary.get("provenance") or {}
    predictions = [Path(str(p.get("path"))) for p in provenance.get("predictions") or [] if isinstance(p, dict)]
    roots = [r for r in ((provenance.get("dataset") or {}).get("root"),
                         (provenance.get("reference") or {}).get("path")) if r]
    return predictions, [Path(str(r)) for r in roots]


def case_files(folder: Path, summary: dict, case: str, source: str = "", dice: float = math.nan,
               images: Path | None = None, labels: Path | None = None) -> CaseFiles:
    """The files of ``case`` of the evaluation in ``folder`` (its ``summary``) found where the module docstring
    says; ``source`` names the evaluation on the page."""
    predicted, roots = _recorded(summary)
    outputs = [folder / "predictions", *predicted, folder / "uncertainty"]  # mcseg-evaluate-folder --save-uncertainty
    found = CaseFiles(case, source, dice, prediction=_first(outputs, [case]),
                      probabilities=_first(outputs, [f"{case}_probs"]),
                      uncertainty=_first(outputs, [f"{case}_entropy"]))
    image_dirs = ([images] if images else []) + [r / d for r in roots for d in IMAGE_FOLDERS]
    label_dirs = ([labels] if labels else []) + [r / d for r in roots for d in LABEL_FOLDERS] + roots
    found.image = _first(image_dirs, [case, f"{case}_0000"])
    found.label = _first(label_dirs, [case])
    fits = sorted(p for p in (folder / "conformal").glob("*") if p.is_dir()) if (folder / "conformal").is_dir() else []
    for fit in fits:
        sure = sorted(fit.glob(f"{case}_sure_*.nii*"))
        if sure:
            found.sure, found.possible = sure, sorted(fit.glob(f"{case}_possible_*.nii*"))
            break
    return found

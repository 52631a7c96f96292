"""The cases of a folder command's output as report.html draws and scores them (:mod:`mcseg.report.folder_report`).

A case is read with its tool's own reader (:meth:`mcseg.evaluation.formats.PredictionFormat.read`) on its label's
grid (the label in the reference), else on its image's (``--images``; a case with neither is left out and said):
probabilities channel last, the arg-max as the prediction (regions: p > 0.5 per region, no probabilities drawn), the
label, the image (``<case>_0000`` / ``<case>`` in ``--images``, else in the reference's ``imagesTr`` / ``imagesTs``)
and the conformal masks written in the output folder. Its Dice (:func:`mean_dice`): the mean over the foreground
classes present in the label or the prediction of 2|P n G| / (|P| + |G|); NaN without a label.

:func:`calibration_stats`: for the calibration report, the top-label reliability sums (:func:`mcseg.metrics.
calibration.case_calibration`) of a labelled case before and after calibration, over the voxels of the fit's
calibration region, each with its own prediction (union_foreground: label or prediction foreground).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from mcseg.evaluation.case_files import IMAGE_FOLDERS
from mcseg.report.case_view import CaseVolumes

__all__ = ["calibration_stats", "case_dice", "case_volumes", "mean_dice", "read_folder_case"]


def mean_dice(prediction: np.ndarray, label: np.ndarray, classes: int) -> float:
    """The mean foreground Dice of a label map ``prediction`` against ``label`` (module docstring)."""
    values = []
    for k in range(1, classes):
        p, g = prediction == k, label == k
        total = int(p.sum()) + int(g.sum())
        if total:
            values.append(2 * int((p & g).sum()) / total)
    return float(np.mean(values)) if values else math.nan


def _image(case: str, images: Path | None, reference) -> tuple[np.ndarray | None, str | None]:
    import nibabel as nib

    folders = ([images] if images else []) + [Path(reference.root) / d for d in IMAGE_FOLDERS]
    for folder in folders:
        for name in (f"{case}_0000", case):
            for suffix in (".nii.gz", ".nii"):
                path = Path(folder) / f"{name}{suffix}"
                if path.is_file():
                    array = np.asanyarray(nib.load(str(path)).dataobj)
                    return (array[..., 0] if array.ndim == 4 else array), path.name
    return None, None


def read_folder_case(folder, case: str, reference, images: Path | None):
    """``(grid volume, label array or None, probabilities C x S tensor or None, tool's label map)`` of ``case``
    of the prediction folder ``folder``; None when the case has neither a label nor an image in ``images``."""
    from mcseg.data.reference import FolderError
    from mcseg.evaluation.folders import image_path, read_case, read_unlabelled

    if case in reference.labels:
        grid, _, probs, prediction, _ = read_case([folder], reference, case)
        return grid, np.asarray(grid.array), probs, prediction
    if images is None:
        return None
    try:
        image_path(images, case)
    except FolderError:
        return None
    grid, _, probs, prediction, _ = read_unlabelled(folder, case, images)
    return grid, None, probs, prediction


def _drawn(read, task) -> tuple[np.ndarray | None, np.ndarray]:
    """(channel-last probabilities to draw, the prediction) of a read case: the arg-max of softmax probabilities;
    regions: p > 0.5 per region, no probabilities; label maps only: the tool's own."""
    _, _, probs, own = read
    p = None if probs is None else np.moveaxis(probs.numpy(), 0, -1)
    if p is not None and not task.multilabel:
        return p, np.argmax(p, -1)
    if p is not None:
        return None, p > 0.5
    return None, np.asarray(own.numpy() if isinstance(own, torch.Tensor) else own)


def case_dice(read, task) -> float:
    """The mean foreground Dice of a read case (:func:`mean_dice`); NaN without a label or for regions."""
    label = read[1]
    if label is None or task.multilabel:
        return math.nan
    return mean_dice(_drawn(read, task)[1], label, task.channels)


def case_volumes(read, case: str, source: str, reference, images: Path | None, masks: Path | None = None,
                 dice: float | None = None, notes: list[str] | None = None) -> CaseVolumes:
    """A case read by :func:`read_folder_case` (``read``) as the view draws it, with the conformal masks
    ``<case>_{sure,possible}_*.nii.gz`` of ``masks`` where given."""
    import nibabel as nib

    grid, label, _, _ = read
    p, prediction = _drawn(read, reference.task)
    image, image_name = _image(case, images, reference)
    dice = case_dice(read, reference.task) if dice is None else dice
    found = {kind: sorted(Path(masks).glob(f"{case}_{kind}_*.nii.gz")) if masks else [] for kind in
             ("sure", "possible")}
    return CaseVolumes(case, source, dice, tuple(float(s) for s in grid.spacing[:3]), p, prediction, label, image,
                       None, *[[np.asanyarray(nib.load(str(f)).dataobj) for f in found[k]] for k in ("sure", "possible")],
                       {"image": image_name} if image_name else {}, list(notes or []))


def calibration_stats(raw: torch.Tensor, calibrated: torch.Tensor, label: np.ndarray, region: str, spacing,
                      n_bins: int):
    """The calibration statistics of one labelled case before and after calibration (module docstring)."""
    from mcseg.metrics.calibration import case_calibration
    from mcseg.metrics.regions import region_mask

    truth = torch.from_numpy(np.asarray(label).astype(np.int64))
    out = []
    for probs in (raw, calibrated):
        probs = probs.float()
        mask = region_mask(region, truth, probs.argmax(0), spacing)
        out.append(case_calibration(probs, truth, n_bins, mask).stats)
    return out

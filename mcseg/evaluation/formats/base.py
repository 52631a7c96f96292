"""The face every prediction format shows (:class:`PredictionFormat`) and the checks they share.

A format is a class: :meth:`~PredictionFormat.detect` tells how many of its case files a folder holds (0: not
this format), an instance is one folder (``read`` a case as ``C x *S`` probabilities in the reference label's file voxel order,
checked against the label's grid; ``write`` a case's probabilities back in the tool's own files), and
:data:`mcseg.evaluation.formats.FORMATS` lists the classes detection and ``mcseg-calibrate-folder`` go through.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from mcseg.data.io import Volume
from mcseg.data.reference import FolderError, Task
from mcseg.evaluation.provenance import file_sha256

__all__ = ["CasePrediction", "PredictionFormat", "SUM_TOLERANCE", "Scaled", "calibration_of", "same_grid"]

# Softmax channels must sum to 1 within this (float32 rounding is ~1e-7; float16 files get K half-ulps of 1 more)
SUM_TOLERANCE = 1e-3
# ``(case, path, probs, channel_axis) -> the calibrated probs``, same layout: what ``write`` writes back
Scaled = Callable[[str, Path, np.ndarray, int], np.ndarray]


@dataclass
class CasePrediction:
    """One case of a prediction folder: probabilities ``C x *S`` (the label's file order, float32), the tool's
    own label map when it wrote one (already in the evaluator's layout), and the files read."""

    probs: np.ndarray | None
    prediction: torch.Tensor | None
    files: list[Path]


def calibration_of(folder: Path) -> dict | None:
    """What ``mcseg-calibrate-folder`` wrote into ``folder/calibration.json`` about the files it calibrated (the
    fit and scaler they carry, the fit cases among them; its sha256), or None for a folder it did not write."""
    path = Path(folder) / "calibration.json"
    if not path.is_file():
        return None
    try:
        applied = json.loads(path.read_text()).get("applied")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(applied, dict):
        return None
    return {"file": str(path.resolve()), "sha256": file_sha256(path),
            **{k: applied.get(k) for k in ("fit", "scaler", "to", "fit_cases_calibrated")}}


class PredictionFormat:
    """A folder of one tool's saved probabilities (:func:`mcseg.evaluation.formats.open_folder`).

    A new format subclasses this with ``format`` (its ``--format`` name), ``tool``, :meth:`pattern`,
    :meth:`detect`, :meth:`_scan` (``{case: file}``), :meth:`read` and :meth:`write`, and is one entry of
    ``FORMATS``. ``options`` are the command line's (``monai_postfix``, ``probs_dir``); each format takes what
    it needs."""

    format: ClassVar[str] = ""
    tool: ClassVar[str] = ""
    label_maps_alone: ClassVar[bool] = False  # a folder of label maps alone (no probabilities) is of this format

    def __init__(self, path: Path, task: Task, **options) -> None:
        self.path, self.task, self.options = Path(path), task, options
        self.files = self._scan()

    @classmethod
    def pattern(cls, **options) -> str:
        """How its case files are named, for messages (``<case>.npz``)."""
        raise NotImplementedError

    @classmethod
    def detect(cls, folder: Path, **options) -> int:
        """How many case files of this format ``folder`` holds (0: not this format)."""
        raise NotImplementedError

    @classmethod
    def declared_classes(cls, folder: Path) -> Path | None:
        """The dataset.json the folder's predictions come with, when the format has one."""
        return None

    has_probs: bool = True  # the cases carry probabilities (else label maps alone, scored without calibration)

    def _scan(self) -> dict[str, Path]:
        raise NotImplementedError

    def cases(self) -> list[str]:
        return sorted(self.files)

    def config_files(self) -> list[Path]:
        """Files besides the cases' that say how to read them (plans.json, dataset.json); copied on write."""
        return []

    def case_files(self, case: str) -> list[Path]:
        """The files of one case."""
        return [self.files[case]]

    def read(self, case: str, label: Volume, label_path: Path) -> CasePrediction:
        raise NotImplementedError

    def write(self, case: str, scaled: Scaled, out_dir: Path) -> list[str]:
        """Write ``case`` with its probabilities passed through ``scaled`` to ``out_dir`` in this format (the
        tool's own files, which its own tools read); return the files written, relative to ``out_dir``."""
        raise FolderError(f"{self.path}: mcseg cannot write {self.tool} files")

    def identity(self) -> dict:
        calibration = calibration_of(self.path)
        return {"path": str(self.path.resolve()), "format": self.format, "tool": self.tool, "version": None,
                "version_note": "the tool does not write its version into these files",
                **({"calibration": calibration} if calibration else {})}

    def check_probabilities(self, case: str, path: Path, probs: np.ndarray) -> np.ndarray:
        """``probs`` (``C x *S``) as float32 after the checks every format shares: the task's channel count, finite
        values in [0, 1], softmax channels summing to 1; each failure one line naming the case and file."""
        if probs.shape[0] != self.task.channels:
            hint = (" (a region model has no background channel)" if self.task.multilabel else
                    " (a softmax model has a background channel)")
            raise FolderError(f"case {case}: {path.name} has {probs.shape[0]} channels, the task is "
                              f"{self.task.describe()}{hint}")
        if not np.isfinite(probs).all():
            raise FolderError(f"case {case}: {path.name} holds {int((~np.isfinite(probs)).sum())} non-finite values")
        lo, hi = float(probs.min()), float(probs.max())
        if lo < 0 or hi > 1 + 1e-6:
            raise FolderError(f"case {case}: {path.name} holds values in [{lo:.6g}, {hi:.6g}], outside [0, 1] by "
                              f"{max(-lo, hi - 1):.3g} (logits, not probabilities?)")
        if not self.task.multilabel:
            sums = probs.sum(0, dtype=np.float64)
            tolerance = SUM_TOLERANCE if probs.dtype != np.float16 else SUM_TOLERANCE + probs.shape[0] * 2.0 ** -12
            deviation = float(np.abs(sums - 1).max())
            if deviation > tolerance:
                worst = np.unravel_index(int(np.abs(sums - 1).argmax()), sums.shape)
                raise FolderError(f"case {case}: {path.name}: the {probs.shape[0]} softmax channels sum to "
                                  f"{float(sums.min()):.6g}..{float(sums.max()):.6g}, off 1 by up to {deviation:.3g} "
                                  f"(voxel {tuple(int(i) for i in worst)}; tolerance {tolerance:g}): not a softmax "
                                  f"(a region model's sigmoids read as labels?)")
        return np.ascontiguousarray(probs, dtype=np.float32)


def same_grid(case: str, what: str, path: Path, shape, spacing, affine, label: Volume, label_path: Path) -> None:
    """Shape, spacing and affine of a prediction against the label's, one line with the size of the deviation."""
    if tuple(shape) != tuple(label.spatial_shape):
        raise FolderError(f"case {case}: {what} {path.name} has shape {tuple(shape)} in the label's axis order, "
                          f"label {label_path.name} has {tuple(label.spatial_shape)}")
    if spacing is not None:
        diff = float(np.abs(np.asarray(spacing, float) - np.asarray(label.spacing, float)).max())
        if not np.allclose(spacing, label.spacing, rtol=1e-5, atol=1e-6):
            raise FolderError(f"case {case}: {what} {path.name} has spacing {tuple(round(float(s), 6) for s in spacing)} "
                              f"mm, label {label_path.name} has {tuple(round(float(s), 6) for s in label.spacing)} mm "
                              f"(off by up to {diff:.3g} mm)")
    if affine is not None:
        a, b = np.asarray(affine, np.float64), np.asarray(label.affine, np.float64)
        if not np.allclose(a, b, rtol=1e-5, atol=1e-4):
            raise FolderError(f"case {case}: {what} {path.name} and label {label_path.name} have different affines "
                              f"(largest difference {float(np.abs(a - b).max()):.3g})")

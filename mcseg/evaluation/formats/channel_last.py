"""Probability maps saved as NIfTI with the channels last: MONAI's ``SaveImage`` and mcseg's own.

* ``monai``: MONAI ``SaveImage`` probability maps, ``<name>/<name>_<postfix>.nii.gz`` (or without the
  sub-folder), 4D NIfTI with the channels last (2D images: ``(H, W, 1, C)``).
* ``mcseg``: mcseg's own ``<case>_probs.nii.gz`` (channels last) with the label maps ``<case>.nii.gz`` beside
  them where there are (or the label maps alone, scored without calibration).

Written back (calibrated) in place of their own files, with their NIfTI header; mcseg's label maps re-derived.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mcseg.data.io import Volume, read_volume
from mcseg.data.reference import FolderError, Task, case_volumes
from mcseg.evaluation.formats.base import CasePrediction, PredictionFormat, Scaled, same_grid

__all__ = ["ChannelLastFormat", "McsegFormat", "MonaiFormat"]


def _monai_files(folder: Path, postfix: str) -> dict[str, Path]:
    tag = f"_{postfix}"
    found = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        for suffix in (".nii.gz", ".nii"):
            if (sub / f"{sub.name}{tag}{suffix}").is_file():
                found[sub.name] = sub / f"{sub.name}{tag}{suffix}"
    for case, path in case_volumes(folder, tag).items():
        if case in found:
            raise FolderError(f"{folder}: case {case} is both {found[case]} and {path}")
        found[case] = path
    return found


class ChannelLastFormat(PredictionFormat):
    """Probability maps as NIfTI with the channels last (MONAI's ``SaveImage``, mcseg's ``<case>_probs``)."""

    def read(self, case: str, label: Volume, label_path: Path) -> CasePrediction:
        path = self.files[case]
        dims = len(label.spacing)
        vol = read_volume(path, dims)
        arr = np.asarray(vol.array)
        if arr.ndim == dims + 2 and arr.shape[dims] == 1:  # MONAI saves a 2D map as (H, W, 1, C)
            arr = arr[..., 0, :]
        if arr.ndim != dims + 1:
            raise FolderError(f"case {case}: {path.name} has shape {arr.shape}, expected {dims} spatial axes and the "
                              f"channels last (a one-channel map saved without its channel axis?)")
        probs = self.check_probabilities(case, path, np.moveaxis(arr, -1, 0))
        same_grid(case, "probabilities", path, probs.shape[1:], vol.spacing, vol.affine, label, label_path)
        return CasePrediction(probs, self._label_map(case, label, label_path), [path])

    def _label_map(self, case: str, label: Volume, label_path: Path) -> torch.Tensor | None:
        return None

    def write(self, case: str, scaled: Scaled, out_dir: Path) -> list[str]:
        """The map at the same path under ``out_dir``, float32, with its NIfTI header."""
        return [self._write_map(case, scaled, out_dir)[0]]

    def _write_map(self, case: str, scaled: Scaled, out_dir: Path) -> tuple[str, np.ndarray]:
        """:meth:`write`'s file (relative to ``out_dir``) and the calibrated probabilities it holds."""
        import nibabel as nib

        from mcseg.files import atomic_write

        path = self.files[case]
        img = nib.load(str(path))
        probs = scaled(case, path, img.get_fdata(dtype=np.float32), -1)
        target = out_dir / path.relative_to(self.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        header = img.header.copy()
        header.set_data_dtype(np.float32)
        atomic_write(target, lambda tmp: nib.save(nib.Nifti1Image(probs, img.affine, header), str(tmp)))
        return target.relative_to(out_dir).as_posix(), probs


class MonaiFormat(ChannelLastFormat):
    format = "monai"
    tool = "MONAI SaveImage"

    def __init__(self, path: Path, task: Task, monai_postfix: str = "trans", **options) -> None:
        self.postfix = monai_postfix
        super().__init__(path, task, monai_postfix=monai_postfix, **options)

    @classmethod
    def pattern(cls, monai_postfix: str = "trans", **options) -> str:
        return f"<name>/<name>_{monai_postfix}.nii.gz"

    @classmethod
    def detect(cls, folder: Path, monai_postfix: str = "trans", **options) -> int:
        return len(_monai_files(Path(folder), monai_postfix))

    def _scan(self) -> dict[str, Path]:
        return _monai_files(self.path, self.postfix)


class McsegFormat(ChannelLastFormat):
    """mcseg's ``<case>_probs.nii.gz`` (in the folder, or in ``probs_dir``), scored with the label maps
    ``<case>.nii.gz`` of the folder where there are; a folder of label maps alone is scored without
    calibration (the probabilities are then None)."""

    format = "mcseg"
    tool = "mcseg"
    label_maps_alone = True

    def __init__(self, path: Path, task: Task, probs_dir: Path | None = None, **options) -> None:
        self.probs_dir = Path(probs_dir) if probs_dir is not None else None
        super().__init__(path, task, probs_dir=probs_dir, **options)

    @classmethod
    def pattern(cls, **options) -> str:
        return "<case>_probs.nii.gz"

    @classmethod
    def detect(cls, folder: Path, **options) -> int:
        return len(case_volumes(Path(folder), "_probs"))

    def _scan(self) -> dict[str, Path]:
        self.label_maps = case_volumes(self.path)
        probs = case_volumes(self.probs_dir or self.path, "_probs")
        missing = sorted(set(self.label_maps) - set(probs))
        if (probs or self.probs_dir is not None) and self.label_maps and missing:
            raise FolderError(f"{len(missing)} case(s) without <case>_probs.nii.gz in {self.probs_dir or self.path}: "
                              f"{', '.join(missing[:10])}")
        self.has_probs = bool(probs)
        return probs if probs and not self.label_maps else {c: probs.get(c) for c in self.label_maps}

    def case_files(self, case: str) -> list[Path]:
        return [p for p in (self.files.get(case), self.label_maps.get(case)) if p is not None]

    def read(self, case: str, label: Volume, label_path: Path) -> CasePrediction:
        if self.has_probs:
            pred = super().read(case, label, label_path)
            return CasePrediction(pred.probs, pred.prediction, pred.files + ([self.label_maps[case]]
                                                                              if case in self.label_maps else []))
        return CasePrediction(None, self._label_map(case, label, label_path), [self.label_maps[case]])

    def write(self, case: str, scaled: Scaled, out_dir: Path) -> list[str]:
        """The probability map (as every channel-last map), and the case's label map where there is one,
        re-derived from the calibrated probabilities (arg-max; regions: p > 0.5, channel last)."""
        import nibabel as nib

        from mcseg.files import atomic_write

        written, probs = self._write_map(case, scaled, out_dir)
        if case not in self.label_maps:
            return [written]
        maps = self.label_maps[case]
        ref = nib.load(str(maps))
        channels_first = np.moveaxis(probs, -1, 0)
        labels = (channels_first > 0.5).astype(np.uint8) if self.task.multilabel else channels_first.argmax(0)
        labels = np.moveaxis(labels, 0, -1) if self.task.multilabel else labels
        out = nib.Nifti1Image(labels.reshape(ref.shape).astype(ref.get_data_dtype()), ref.affine, ref.header)
        atomic_write(out_dir / maps.name, lambda tmp: nib.save(out, str(tmp)))
        return [written, maps.name]

    def _label_map(self, case: str, label: Volume, label_path: Path) -> torch.Tensor | None:
        path = self.label_maps.get(case)
        if path is None:
            return None
        vol = read_volume(path, len(label.spacing))
        same_grid(case, "prediction", path, vol.spatial_shape, vol.spacing, vol.affine, label, label_path)
        arr = np.asarray(vol.array)
        if self.task.multilabel and arr.ndim == len(label.spacing) + 1:
            arr = np.moveaxis(arr, -1, 0)  # mcseg writes multi-label predictions channel last
        elif arr.ndim != len(label.spacing):
            raise FolderError(f"case {case}: {path.name} has shape {arr.shape}; a label map has one value per voxel")
        if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.round(arr)):
            raise FolderError(f"case {case}: {path.name} holds non-integer values; expected a label map")
        return torch.from_numpy(arr.astype(np.int64))

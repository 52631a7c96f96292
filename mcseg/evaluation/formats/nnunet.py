"""nnU-Net v2's prediction folders: ``<case>.npz`` (one key, ``probabilities``, ``(C, z, y, x)``: the reader's
array order, reversed against the file's), ``<case>.pkl`` and ``<case><file_ending>``, as ``nnUNetv2_predict
--save_probabilities`` and ``nnUNetv2_train --npz`` write them; ``plans.json`` and ``dataset.json`` beside the
files or up to two folders above (the trainer folder of ``fold_k/validation``). With the reorienting
``NibabelIOWithReorient`` the npz is in the axes of the image reoriented to RAS, mapped back as nnU-Net's
``write_seg`` maps its label map (``SimpleITKIOWithReorient`` likewise, with ``DICOMOrient``). Label-based models:
a softmax, one channel per label with background; region-based models (a label of ``dataset.json`` is a list of
several values): one sigmoid per foreground region, no background channel.

Besides the checks every format shares, the label map must be nnU-Net's own reading of the probabilities
(argmax, or the region rule) and the pkl's shape and spacing must agree. Written back (calibrated) as nnU-Net
writes it: npz (float32, same axis order), pkl copied, the label map re-derived on the original label map's grid.
"""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import torch

from mcseg.data.cases import to_regions
from mcseg.data.io import Volume, read_volume
from mcseg.data.reference import FolderError, Task, classes_options, read_json, task_from_labels
from mcseg.evaluation.formats.base import CasePrediction, PredictionFormat, Scaled, same_grid

__all__ = ["NnUNetFormat", "segmentation_of"]

# nnU-Net's readers whose npz mcseg reads: in the files' own axes, reversed (SimpleITKIO, NibabelIO), or in the
# axes of the image reoriented to RAS, read back as the reader's write_seg maps its label map (the other two)
_ARRAY_ORDER_READERS = ("SimpleITKIO", "NibabelIO", "NibabelIOWithReorient", "SimpleITKIOWithReorient")


class NnUNetFormat(PredictionFormat):
    """``<case>.npz`` + ``<case>.pkl`` + ``<case><file_ending>`` written by nnU-Net v2."""

    format = "nnunet"
    tool = "nnU-Net v2"

    @classmethod
    def pattern(cls, **options) -> str:
        return "<case>.npz"

    @classmethod
    def detect(cls, folder: Path, **options) -> int:
        return len(list(Path(folder).glob("*.npz")))

    @classmethod
    def declared_classes(cls, folder: Path) -> Path | None:
        return _beside_or_above(Path(folder), "dataset.json")

    def _scan(self) -> dict[str, Path]:
        self.plans_path = self._find("plans.json")
        self.dataset_path = self._find("dataset.json")
        plans, dataset = read_json(self.plans_path), read_json(self.dataset_path)
        reader = dataset.get("overwrite_image_reader_writer") or plans.get("image_reader_writer")
        if reader not in _ARRAY_ORDER_READERS:
            raise FolderError(f"{self.plans_path}: image_reader_writer {reader!r}: mcseg reads nnU-Net folders of "
                              f"{', '.join(_ARRAY_ORDER_READERS)} (NIfTI, mha, nrrd), not 2D natural images or TIFF")
        self.reader = reader
        self.transpose_backward = [int(i) for i in plans.get("transpose_backward", [])]
        own = task_from_labels(dataset.get("labels") or {}, self.dataset_path, dataset.get("regions_class_order"))
        if own != self.task:
            named = own.channels == self.task.channels and own.regions == self.task.regions  # names differ only
            raise FolderError(f"{self.dataset_path} declares {own.describe()}, the reference {self.task.describe()}"
                              + (f"; if the reference's labels are these, pass {classes_options(self.dataset_path, own)}"
                                 if named else ""))
        self.file_ending = str(dataset.get("file_ending", ".nii.gz"))
        files = {p.name[:-4]: p for p in sorted(self.path.glob("*.npz"))}
        for case in files:
            for other in (f"{case}.pkl", f"{case}{self.file_ending}"):
                if not (self.path / other).is_file():
                    raise FolderError(f"case {case}: {self.path / other} is missing (nnU-Net writes {case}.npz, "
                                      f"{case}.pkl and {case}{self.file_ending} together)")
        return files

    def _find(self, name: str) -> Path:
        found = _beside_or_above(self.path, name)
        if found is None:
            raise FolderError(f"{self.path}: no {name} here or in the two folders above (nnUNetv2_predict copies it "
                              f"into its output folder; validation folders have it in the trainer folder)")
        return found

    def config_files(self) -> list[Path]:
        return [self.plans_path, self.dataset_path]

    def case_files(self, case: str) -> list[Path]:
        return [self.path / f"{case}{e}" for e in (".npz", ".pkl", self.file_ending)]

    def read(self, case: str, label: Volume, label_path: Path) -> CasePrediction:
        npz, pkl, seg_path = (self.path / f"{case}{e}" for e in (".npz", ".pkl", self.file_ending))
        try:
            with np.load(npz) as stored:
                keys = list(stored.keys())
                if keys != ["probabilities"]:
                    raise FolderError(f"case {case}: {npz.name} holds {keys}, nnU-Net writes one array "
                                      f"'probabilities'")
                raw = stored["probabilities"]
            with open(pkl, "rb") as f:
                props = pickle.load(f)  # nnU-Net's own properties file, from the folder being evaluated
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
            raise FolderError(f"case {case}: cannot read {npz.name} or {pkl.name} ({exc})") from None
        dims = len(label.spacing)
        if raw.ndim == dims + 2 and raw.shape[1] == 1:  # a 2D image: nnU-Net's arrays are (C, 1, y, x)
            raw = raw[:, 0]
        if raw.ndim != dims + 1:
            raise FolderError(f"case {case}: {npz.name} has shape {raw.shape}, expected (C, *{dims} spatial axes) "
                              f"for the {dims}D label {label_path.name}")
        before = props.get("shape_before_cropping")
        if before is not None and self.transpose_backward:
            array_order = tuple(int(before[i]) for i in self.transpose_backward)[-dims:]
            if array_order != tuple(raw.shape[1:]):
                raise FolderError(f"case {case}: {npz.name} has spatial shape {tuple(raw.shape[1:])}, its "
                                  f"{pkl.name} says {array_order} (shape_before_cropping {tuple(before)} after "
                                  f"transpose_backward): an axis out of order?")
        probs, affine = self.file_order(case, raw, props)
        stuff = props.get("sitk_stuff") or {}
        spacing = stuff.get("spacing") or (list(props["spacing"])[::-1][:dims] if "spacing" in props else None)
        if affine is not None:
            spacing = None  # the pkl's spacing is the reoriented image's; the affine read back is checked instead
        probs = self.check_probabilities(case, npz, probs)
        same_grid(case, "probabilities", npz, probs.shape[1:], spacing, affine, label, label_path)
        seg_vol = read_volume(seg_path, dims)
        same_grid(case, "label map", seg_path, seg_vol.spatial_shape, seg_vol.spacing, seg_vol.affine, label,
                   label_path)
        seg = np.asarray(seg_vol.array).astype(np.int64)
        self._check_seg(case, npz, seg_path, probs, seg)
        prediction = to_regions(seg, self.task.regions) if self.task.multilabel else seg
        return CasePrediction(probs, torch.from_numpy(np.asarray(prediction, dtype=np.int64)), [npz, pkl, seg_path])

    def write(self, case: str, scaled: Scaled, out_dir: Path) -> list[str]:
        """nnU-Net's ``<case>.npz`` (float32, same axis order), ``<case>.pkl`` copied, the label map re-derived as
        nnU-Net does (argmax; regions: p > 0.5 in ``regions_class_order``) on the original label map's grid."""
        import SimpleITK as sitk

        from mcseg.files import atomic_write

        with np.load(self.path / f"{case}.npz") as stored:
            probs = scaled(case, self.path / f"{case}.npz", stored["probabilities"], 0)
        atomic_write(out_dir / f"{case}.npz", lambda tmp: _savez(tmp, probs))
        shutil.copy2(self.path / f"{case}.pkl", out_dir / f"{case}.pkl")
        props = pickle.loads((self.path / f"{case}.pkl").read_bytes())  # nnU-Net's own file, of the folder given
        seg_path = self.path / f"{case}{self.file_ending}"
        template = sitk.ReadImage(str(seg_path))
        seg = segmentation_of(probs, self.task)  # in nnU-Net's array order, then the file's (x, y[, z])
        seg = self.file_order(case, seg.reshape(-1, *seg.shape[-template.GetDimension():]), props)[0][0]
        array = sitk.GetArrayViewFromImage(template)  # SimpleITK's (z, y, x): the file's axes reversed
        image = sitk.GetImageFromArray(np.ascontiguousarray(seg.T).astype(array.dtype))
        image.CopyInformation(template)
        atomic_write(out_dir / seg_path.name, lambda tmp: sitk.WriteImage(image, str(tmp), True))
        return [f"{case}.npz", f"{case}.pkl", seg_path.name]

    def file_order(self, case: str, array: np.ndarray, props: dict) -> tuple[np.ndarray, np.ndarray | None]:
        """``C x`` nnU-Net's array order (2D: the leading singleton dropped) to ``C x`` the files' voxel order
        (x, y[, z]); with the reorienting reader also the affine this gives (None otherwise)."""
        if self.reader == "SimpleITKIOWithReorient":
            return _from_dicom_orientation(case, self.path / f"{case}.pkl", array, props)
        array = np.transpose(array, (0, *range(array.ndim - 1, 0, -1)))
        if self.reader != "NibabelIOWithReorient":
            return array, None
        return _from_ras(case, self.path / f"{case}.pkl", array, props)

    def _check_seg(self, case: str, npz: Path, seg_path: Path, probs: np.ndarray, seg: np.ndarray) -> None:
        """The label map must be nnU-Net's own reading of the probabilities (argmax; regions: each region in
        ``regions_class_order`` where p > 0.5, later ones overwriting), up to ties (within 1e-6)."""
        derived = segmentation_of(probs, self.task)
        if self.task.multilabel:
            tied = (np.abs(probs - 0.5) <= 1e-6).any(0)
        else:
            chosen = np.take_along_axis(probs, np.clip(seg, 0, probs.shape[0] - 1)[None], 0)[0]
            tied = chosen >= probs.max(0) - 1e-6
        wrong = (derived != seg) & ~tied
        if wrong.any():
            n = int(wrong.sum())
            rule = "region rule (p > 0.5 in regions_class_order)" if self.task.multilabel else "argmax"
            raise FolderError(f"case {case}: {seg_path.name} differs from nnU-Net's {rule} of {npz.name} in {n} of "
                              f"{wrong.size} voxels ({100 * n / wrong.size:.3g}%): a channel or axis out of order?")


def _beside_or_above(folder: Path, name: str) -> Path | None:
    """``name`` in ``folder`` or up to two folders above (the trainer folder of ``fold_k/validation``)."""
    return next((here / name for here in (folder, folder.parent, folder.parent.parent) if (here / name).is_file()),
                None)


def _savez(tmp: Path, probs: np.ndarray) -> None:
    with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a temporary name
        np.savez_compressed(f, probabilities=probs)


def _from_ras(case: str, pkl: Path, probs: np.ndarray, props: dict) -> tuple[np.ndarray, np.ndarray]:
    """``C x`` (x, y, z) of the RAS-reoriented image back to the file's own axes, as NibabelIOWithReorient's
    write_seg maps its label map back (nibabel's ``as_reoriented`` from RAS to the original orientation); the
    affine this gives, to check against the label's."""
    import nibabel as nib
    from nibabel.orientations import axcodes2ornt, io_orientation, ornt_transform

    stuff = props.get("nibabel_stuff") or {}
    if "original_affine" not in stuff or "reoriented_affine" not in stuff:
        raise FolderError(f"case {case}: {pkl.name} has no nibabel_stuff original_affine and reoriented_affine, "
                          f"which NibabelIOWithReorient writes")
    data = np.moveaxis(probs, 0, -1)
    image = nib.Nifti1Image(data, np.asarray(stuff["reoriented_affine"], np.float64), dtype=data.dtype)
    back = image.as_reoriented(ornt_transform(axcodes2ornt("RAS"), io_orientation(stuff["original_affine"])))
    return np.moveaxis(np.asarray(back.dataobj), -1, 0), back.affine


def _from_dicom_orientation(case: str, pkl: Path, array: np.ndarray, props: dict) -> tuple[np.ndarray, np.ndarray]:
    """``C x`` SimpleITKIOWithReorient's array order (the image reoriented by ``DICOMOrient``) to ``C x`` the
    file's voxel order, one channel at a time as its write_seg does (the reoriented geometry of the pkl, then
    ``DICOMOrient`` to ``original_orientation``); the affine this gives, to check against the label's."""
    import SimpleITK as sitk

    from mcseg.data.io import itk_geometry

    stuff = props.get("sitk_stuff") or {}
    if not {"spacing", "origin", "direction", "original_orientation"} <= set(stuff):
        raise FolderError(f"case {case}: {pkl.name} has no sitk_stuff spacing, origin, direction and "
                          f"original_orientation, which SimpleITKIOWithReorient writes")
    channels = []
    for channel in array:
        image = sitk.GetImageFromArray(np.ascontiguousarray(channel))
        image.SetSpacing(stuff["spacing"])
        image.SetOrigin(stuff["origin"])
        image.SetDirection(stuff["direction"])
        image = sitk.DICOMOrient(image, stuff["original_orientation"])
        channels.append(sitk.GetArrayFromImage(image))
    back = np.stack(channels)
    return np.transpose(back, (0, *range(back.ndim - 1, 0, -1))), itk_geometry(image)[1]


def segmentation_of(probs: np.ndarray, task: Task) -> np.ndarray:
    """nnU-Net's label map of probabilities (``C x *S``): the argmax (label-based), or for each region in
    order the voxels with p > 0.5 set to its ``regions_class_order`` label, later regions overwriting."""
    if not task.multilabel:
        return probs.argmax(0)
    seg = np.zeros(probs.shape[1:], dtype=np.int64)
    for i, value in enumerate(task.regions_class_order):
        seg[probs[i] > 0.5] = value
    return seg

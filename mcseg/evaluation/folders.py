"""Other tools' prediction folders, read exactly, checked against a reference, and evaluated by the protocol.

Saved probabilities enter mcseg at the "probabilities" arrow (docs/protocol.md, "Evaluating predictions made by
another tool"): every case becomes ``C x *S`` probabilities in the reference label's file voxel order (x, y[, z]),
and from there they take the evaluator's path unchanged.

Formats (``FORMATS``; detected from the folder, or stated and then checked against it):

* ``nnunet``: nnU-Net v2 ``<case>.npz`` (one key, ``probabilities``, ``(C, z, y, x)``: the reader's array
  order, reversed against the file's), ``<case>.pkl`` and ``<case><file_ending>``, as
  ``nnUNetv2_predict --save_probabilities`` and ``nnUNetv2_train --npz`` write them; ``plans.json`` and
  ``dataset.json`` beside the files or up to two folders above (the trainer folder of ``fold_k/validation``);
  with the reorienting ``NibabelIOWithReorient`` the npz is in the axes of the image reoriented to RAS, mapped back
  as nnU-Net's ``write_seg`` maps its label map (``SimpleITKIOWithReorient`` likewise, with ``DICOMOrient``).
  Label-based models: a softmax, one channel per label with background; region-based models (a label of
  ``dataset.json`` is a list of several values): one sigmoid per foreground region, no background channel.
* ``monai``: MONAI ``SaveImage`` probability maps, ``<name>/<name>_<postfix>.nii.gz`` (or without the
  sub-folder), 4D NIfTI with the channels last (2D images: ``(H, W, 1, C)``).
* ``mcseg``: mcseg's own ``<case>_probs.nii.gz`` (channels last) with the label maps ``<case>.nii.gz`` beside
  them where there are.

References (:func:`read_reference`): an nnU-Net raw dataset (``dataset.json`` with ``channel_names``, labels in
``labelsTr/<case><file_ending>``), a Medical Segmentation Decathlon folder (``dataset.json`` with ``training``),
or a plain folder of ``<case>.nii.gz`` label maps (classes from ``dataset.json`` beside it or one folder up,
nnU-Net's ``{name: value}`` or MSD's ``{value: name}``). nnU-Net's ``splits_final.json`` selects the
validation cases of a fold (:func:`fold_cases`).

Every check is one line (:class:`FolderError`) naming the case, the file and the size of the deviation:
a stated format the folder contradicts, a case missing on either side, another grid than the label's (shape
after the axis order, spacing, affine), a channel count other than the task's, values outside [0, 1], softmax
channels that do not sum to 1, and, for nnU-Net, a label map that is not nnU-Net's own reading of the
probabilities (argmax, or the region rule) or a pkl whose shape or spacing disagrees.
"""
from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mcseg.data.cases import to_regions
from mcseg.data.io import Volume, read_volume, write_nifti
from mcseg.files import write_csv, write_json
from mcseg.evaluation.cases import UNCERTAINTY_FILES
from mcseg.evaluation.evaluator import Evaluator
from mcseg.config import EvalProtocol
from mcseg.evaluation.folder_outputs import EVALUATE_TOOL, EVALUATION_FILES, claim_output, folder_status, writing
from mcseg.evaluation.provenance import file_sha256
from mcseg.evaluation.split import FAILURE_FILE, PROVENANCE_FILE
from mcseg.metrics.failure import FailureDetection
from mcseg.metrics.uncertainty import MAPS, MemberAccumulator, normalise
from mcseg.rundir import STATUS_FILE

__all__ = ["FORMATS", "FolderError", "PredictionFolder", "Reference", "Task", "declared_classes", "detect_format",
           "evaluate_folders", "fold_cases", "open_folder", "prediction_files", "read_reference"]

FORMATS = ("nnunet", "monai", "mcseg")
TOOLS = {"nnunet": "nnU-Net v2", "monai": "MONAI SaveImage", "mcseg": "mcseg"}
_SUFFIXES = (".nii.gz", ".nii", ".mha", ".nrrd")
_DERIVED = ("_probs", "_entropy", "_expected_entropy", "_mutual_information")
# Softmax channels must sum to 1 within this (float32 rounding is ~1e-7; float16 files get K half-ulps of 1 more)
SUM_TOLERANCE = 1e-3
# nnU-Net's readers whose npz mcseg reads: in the files' own axes, reversed (SimpleITKIO, NibabelIO), or in the
# axes of the image reoriented to RAS, read back as the reader's write_seg maps its label map (the other two)
_ARRAY_ORDER_READERS = ("SimpleITKIO", "NibabelIO", "NibabelIOWithReorient", "SimpleITKIOWithReorient")


class FolderError(ValueError):
    """The folders cannot be evaluated together; the message names the case or file."""


def _case_files(folder: Path, tag: str = "", derived_ok: bool = False) -> dict[str, Path]:
    """``{case: path}`` of the volumes of ``folder`` named ``<case><tag><suffix>`` (without ``tag``: files not
    ending in a derived tag such as ``_probs``)."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a folder")
    files: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        suffix = next((s for s in _SUFFIXES if path.name.endswith(s)), None)
        if suffix is None or not path.is_file():
            continue
        stem = path.name[: -len(suffix)]
        if tag:
            if stem.endswith(tag):
                files[stem[: -len(tag)]] = path
        elif derived_ok or not stem.endswith(_DERIVED):
            if stem in files:
                raise FolderError(f"{folder}: case {stem!r} appears twice ({files[stem].name}, {path.name})")
            files[stem] = path
    return files


# ----------------------------------------------------------------------------------------------- the task
@dataclass
class Task:
    """What the probabilities mean: softmax over ``class_names`` (channel k = label value k), or one sigmoid
    per region (``regions[r]``: the label values region r unites; nnU-Net's ``regions_class_order``)."""

    class_names: list[str]
    regions: list[list[int]] | None = None
    regions_class_order: list[int] | None = None

    @property
    def multilabel(self) -> bool:
        return self.regions is not None

    @property
    def channels(self) -> int:
        return len(self.class_names)

    def describe(self) -> str:
        return (f"{self.channels} sigmoid regions ({', '.join(self.class_names)})" if self.multilabel else
                f"a softmax over {self.channels} labels ({', '.join(self.class_names)})")


def task_from_labels(labels: dict, where: Path, regions_class_order=None) -> Task:
    """The task of a ``dataset.json`` ``labels`` entry: nnU-Net's ``{name: value or [values]}`` (regions when a
    value lists several labels, as nnU-Net's LabelManager decides) or MSD's ``{"0": name}``."""
    if all(str(k).isdigit() for k in labels):  # MSD: value -> name
        values = sorted(int(k) for k in labels)
        if values != list(range(len(values))):
            raise FolderError(f"{where}: label values {values} must be consecutive from 0")
        return Task([str(labels[str(v)] if str(v) in labels else labels[v]) for v in values])
    if "ignore" in labels:
        raise FolderError(f"{where}: the 'ignore' label (nnU-Net's partial annotations) is not evaluated by mcseg; "
                          f"its voxels would count as a class")
    if any(isinstance(v, (list, tuple)) and len(v) > 1 for v in labels.values()):
        names = [k for k, v in labels.items() if v not in (0, [0])]
        regions = [[int(x) for x in (v if isinstance(v, (list, tuple)) else [v])] for k, v in labels.items()
                   if v not in (0, [0])]
        if regions_class_order is None or len(regions_class_order) != len(regions):
            raise FolderError(f"{where}: a region-based dataset needs 'regions_class_order' with one label per "
                              f"region ({len(regions)}), got {regions_class_order!r}")
        return Task(names, regions, [int(c) for c in regions_class_order])
    by_value = {int(v[0] if isinstance(v, (list, tuple)) else v): str(k) for k, v in labels.items()}
    if sorted(by_value) != list(range(len(by_value))):
        raise FolderError(f"{where}: label values {sorted(by_value)} must be consecutive from 0")
    return Task([by_value[v] for v in range(len(by_value))])


def _task_of_json(path: Path) -> Task:
    desc = _read_json(path)
    if not isinstance(desc.get("labels"), dict):
        raise FolderError(f"{path}: no 'labels' entry")
    return task_from_labels(desc["labels"], path, desc.get("regions_class_order"))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FolderError(f"{path}: cannot read JSON ({exc})") from None


# ------------------------------------------------------------------------------------------ the reference
@dataclass
class Reference:
    """The reference labels: ``{case: label file}``, the task, what kind of folder, the files read for it."""

    labels: dict[str, Path]
    task: Task
    kind: str
    root: Path
    files: list[Path] = field(default_factory=list)

    def load(self, case: str, spatial_dims: int | None = None) -> tuple[Volume, torch.Tensor]:
        """The label volume (file order) and the evaluator's label: integer classes, or ``R x *S`` region masks."""
        path = self.labels[case]
        vol = read_volume(path, spatial_dims)
        arr = np.asarray(vol.array)
        if arr.ndim == len(vol.spacing) + 1 and arr.shape[-1] == 1:  # a trailing singleton axis
            arr = arr[..., 0]
        if arr.ndim != len(vol.spacing):
            raise FolderError(f"case {case}: {path.name} has shape {arr.shape}; a label map has one value per voxel")
        if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.round(arr)):
            raise FolderError(f"case {case}: {path.name} holds non-integer values; expected a label map")
        arr = arr.astype(np.int64)
        vol = Volume(arr, vol.spacing, vol.affine)
        top = max(max(r) for r in self.task.regions) if self.task.multilabel else self.task.channels - 1
        if arr.min() < 0 or arr.max() > top:
            raise FolderError(f"case {case}: {path.name} holds label values {int(arr.min())}..{int(arr.max())}, "
                              f"the task {self.task.describe()} has 0..{top}")
        label = to_regions(arr, self.task.regions) if self.task.multilabel else arr
        return vol, torch.from_numpy(np.asarray(label, dtype=np.int64))


def read_reference(path: str | Path, class_names: Sequence[str] | None = None, num_classes: int | None = None,
                   dataset_json: Path | None = None, channels_hint: int | None = None,
                   declared: Path | None = None) -> Reference:
    """An nnU-Net raw dataset, an MSD folder or a plain labels folder (module docstring). Classes from its
    ``dataset.json`` (or ``dataset_json``), else ``class_names`` / ``num_classes``, else ``channels_hint`` (the
    probability maps' channels, a softmax); never from the labels present. ``declared``: the dataset.json the
    predictions come with (:func:`declared_classes`), suggested when nothing says the classes."""
    root = Path(path)
    if not root.is_dir():
        raise FolderError(f"{root}: the reference is not a folder")
    desc_path = root / "dataset.json"
    desc = _read_json(desc_path) if desc_path.is_file() else None
    files: list[Path] = []
    if desc is not None and ("channel_names" in desc or "modality" in desc) and (root / "labelsTr").is_dir() \
            and "training" not in desc:
        ending = str(desc.get("file_ending", ".nii.gz"))
        labels = {p.name[: -len(ending)]: p for p in sorted((root / "labelsTr").iterdir())
                  if p.name.endswith(ending) and p.is_file()}
        kind, task_json = "nnunet", desc_path
    elif desc is not None and "training" in desc:
        labels = {}
        for entry in desc["training"]:
            label = (root / str(entry["label"])).resolve()
            name = label.name
            case = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), label.stem)
            labels[case] = label
        kind, task_json = "msd", desc_path
    else:
        labels = _case_files(root)
        kind = "labels"
        task_json = next((p for p in (root / "dataset.json", root.parent / "dataset.json") if p.is_file()), None)
    task_json = Path(dataset_json) if dataset_json is not None else task_json
    if task_json is not None:
        task = _task_of_json(task_json)
        files.append(task_json)
        if class_names and list(class_names) != task.class_names:
            raise FolderError(f"--class-names {list(class_names)} disagree with {task_json}: {task.class_names}")
        if num_classes and num_classes != task.channels:
            raise FolderError(f"--num-classes {num_classes} disagrees with {task_json}, which declares "
                              f"{task.channels} {'regions' if task.multilabel else 'labels'}")
    elif class_names or num_classes or channels_hint:
        k = num_classes or (len(class_names) if class_names else channels_hint)
        names = list(class_names) if class_names else ["background"] + [f"class_{i}" for i in range(1, k)]
        if len(names) != k:
            raise FolderError(f"{len(names)} class names for {k} classes: {names}")
        task = Task(names)
    else:
        raise FolderError(f"{root}: cannot tell the classes: no dataset.json beside the labels or one folder up; "
                          f"{_classes_advice(declared)}")
    if not labels:
        raise FolderError(f"{root}: no reference label files")
    return Reference(labels, task, kind, root, files)


def declared_classes(pred_dir: Path) -> Path | None:
    """The dataset.json an nnU-Net prediction folder comes with (in it, or up to two folders above, as
    :class:`NnUNetFolder` finds it); None for any other folder."""
    try:
        if detect_format(Path(pred_dir)) != "nnunet":
            return None
    except FolderError:
        return None
    here = Path(pred_dir)
    return next((folder / "dataset.json" for folder in (here, here.parent, here.parent.parent)
                 if (folder / "dataset.json").is_file()), None)


def _classes_advice(declared: Path | None) -> str:
    """What to pass when nothing says the classes: the predictions' own dataset.json where they have one (its
    class names for a label-based task), else the number of classes or their names."""
    if declared is not None:
        try:
            task = _task_of_json(declared)
        except FolderError:
            task = None
        if task is not None:
            return (f"the predictions declare {task.describe()} in {declared}: if the labels are these, pass "
                    f"{_options(declared, task)}")
    return "pass --num-classes K (background included) or --class-names NAME ... (background first)"


def _options(declared: Path, task: Task) -> str:
    """The options that give a reference ``declared``'s classes, each in backquotes, ready to paste."""
    import shlex

    names = "" if task.multilabel else f" or `{shlex.join(['--class-names', *task.class_names])}`"
    return f"`--dataset-json {shlex.quote(str(declared))}`{names}"


def fold_cases(splits_file: str | Path, fold: int | str, part: str = "val") -> list[str]:
    """The ``part`` (val | train) cases of fold ``fold`` of nnU-Net's ``splits_final.json``; ``fold="all"``: the
    union of every fold's validation cases (each training case once, out of fold)."""
    path = Path(splits_file)
    splits = _read_json(path)
    if not isinstance(splits, list) or not all(isinstance(s, dict) and part in s for s in splits):
        raise FolderError(f"{path}: expected nnU-Net's list of {{'train': [...], 'val': [...]}} per fold")
    if str(fold) == "all":
        return sorted({c for s in splits for c in s[part]})
    k = int(fold)
    if not 0 <= k < len(splits):
        raise FolderError(f"{path}: fold {k} does not exist ({len(splits)} folds)")
    return sorted(str(c) for c in splits[k][part])


# ---------------------------------------------------------------------------------------- prediction folders
@dataclass
class CasePrediction:
    """One case of a prediction folder: probabilities ``C x *S`` (the label's file order, float32), the tool's
    own label map when it wrote one (already in the evaluator's layout), and the files read."""

    probs: np.ndarray | None
    prediction: torch.Tensor | None
    files: list[Path]


def _monai_files(folder: Path, postfix: str) -> dict[str, Path]:
    tag = f"_{postfix}"
    found = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        for suffix in (".nii.gz", ".nii"):
            if (sub / f"{sub.name}{tag}{suffix}").is_file():
                found[sub.name] = sub / f"{sub.name}{tag}{suffix}"
    for case, path in _case_files(folder, tag).items():
        if case in found:
            raise FolderError(f"{folder}: case {case} is both {found[case]} and {path}")
        found[case] = path
    return found


def _signals(folder: Path, monai_postfix: str) -> dict[str, int]:
    """How many files of each format the folder holds."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: the prediction folder is not a folder")
    return {"nnunet": len(list(folder.glob("*.npz"))), "monai": len(_monai_files(folder, monai_postfix)),
            "mcseg": len(_case_files(folder, "_probs"))}


def prediction_files(folder: Path, monai_postfix: str = "trans") -> str | None:
    """What prediction files ``folder`` holds, e.g. ``4 <case>.npz (nnU-Net v2)``; None when it holds none."""
    what = {"nnunet": "<case>.npz", "monai": f"<name>_{monai_postfix} maps", "mcseg": "<case>_probs"}
    try:
        found = [f"{n} {what[fmt]} ({TOOLS[fmt]})" for fmt, n in _signals(Path(folder), monai_postfix).items() if n]
        maps = len(_case_files(Path(folder), derived_ok=True))
    except FolderError as exc:
        return f"files of a prediction folder ({exc})"
    return ", ".join(found) or (f"{maps} label map(s)" if maps else None)


def detect_format(folder: Path, stated: str = "auto", monai_postfix: str = "trans") -> str:
    """The folder's format; a stated one the folder contradicts is an error naming what it holds."""
    folder = Path(folder)
    signals = _signals(folder, monai_postfix)
    held = {f: n for f, n in signals.items() if n}
    what = {"nnunet": "<case>.npz", "monai": f"<name>/<name>_{monai_postfix}.nii.gz", "mcseg": "<case>_probs.nii.gz"}
    if stated != "auto":
        if stated not in FORMATS:
            raise FolderError(f"--format {stated}: expected auto or one of {', '.join(FORMATS)}")
        if stated == "mcseg" and not held and _case_files(folder):
            return stated  # label maps alone
        if not held.get(stated):
            listed = ", ".join(f"{n} {what[f]} ({TOOLS[f]})" for f, n in held.items()) or "no probability files"
            raise FolderError(f"{folder}: --format {stated} contradicts the folder: it holds {listed}, "
                              f"and no {what[stated]}")
        return stated
    if not held and _case_files(folder):  # label maps alone: scored without calibration
        return "mcseg"
    if len(held) != 1:
        listed = ", ".join(f"{n} {what[f]}" for f, n in held.items()) or "none of " + ", ".join(what.values())
        raise FolderError(f"{folder}: cannot tell the format ({listed}); pass --format "
                          f"{'|'.join(FORMATS)}")
    return next(iter(held))


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


class PredictionFolder:
    """A folder of one tool's saved probabilities (:func:`open_folder`); ``read`` checks and returns a case."""

    format: str = ""

    def __init__(self, path: Path, task: Task) -> None:
        self.path, self.task = Path(path), task
        self.files = self._scan()

    @property
    def tool(self) -> str:
        return TOOLS[self.format]

    def _scan(self) -> dict[str, Path]:
        raise NotImplementedError

    def cases(self) -> list[str]:
        return sorted(self.files)

    def config_files(self) -> list[Path]:
        """Files besides the cases' that say how to read them (plans.json, dataset.json)."""
        return []

    def case_files(self, case: str) -> list[Path]:
        """The files of one case."""
        return [self.files[case]]

    def read(self, case: str, label: Volume, label_path: Path) -> CasePrediction:
        raise NotImplementedError

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


def _same_grid(case: str, what: str, path: Path, shape, spacing, affine, label: Volume, label_path: Path) -> None:
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


class NnUNetFolder(PredictionFolder):
    """``<case>.npz`` + ``<case>.pkl`` + ``<case><file_ending>`` written by nnU-Net v2."""

    format = "nnunet"

    def _scan(self) -> dict[str, Path]:
        self.plans_path = self._find("plans.json")
        self.dataset_path = self._find("dataset.json")
        plans, dataset = _read_json(self.plans_path), _read_json(self.dataset_path)
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
                              + (f"; if the reference's labels are these, pass {_options(self.dataset_path, own)}"
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
        for folder in (self.path, self.path.parent, self.path.parent.parent):
            if (folder / name).is_file():
                return folder / name
        raise FolderError(f"{self.path}: no {name} here or in the two folders above (nnUNetv2_predict copies it "
                          f"into its output folder; validation folders have it in the trainer folder)")

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
        _same_grid(case, "probabilities", npz, probs.shape[1:], spacing, affine, label, label_path)
        seg_vol = read_volume(seg_path, dims)
        _same_grid(case, "label map", seg_path, seg_vol.spatial_shape, seg_vol.spacing, seg_vol.affine, label,
                   label_path)
        seg = np.asarray(seg_vol.array).astype(np.int64)
        self._check_seg(case, npz, seg_path, probs, seg)
        prediction = to_regions(seg, self.task.regions) if self.task.multilabel else seg
        return CasePrediction(probs, torch.from_numpy(np.asarray(prediction, dtype=np.int64)), [npz, pkl, seg_path])

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


class ChannelLastFolder(PredictionFolder):
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
        _same_grid(case, "probabilities", path, probs.shape[1:], vol.spacing, vol.affine, label, label_path)
        return CasePrediction(probs, self._label_map(case, label, label_path), [path])

    def _label_map(self, case: str, label: Volume, label_path: Path) -> torch.Tensor | None:
        return None


class MonaiFolder(ChannelLastFolder):
    format = "monai"

    def __init__(self, path: Path, task: Task, postfix: str = "trans") -> None:
        self.postfix = postfix
        super().__init__(path, task)

    def _scan(self) -> dict[str, Path]:
        return _monai_files(self.path, self.postfix)


class McsegFolder(ChannelLastFolder):
    """mcseg's ``<case>_probs.nii.gz`` (in the folder, or in ``probs_dir``), scored with the label maps
    ``<case>.nii.gz`` of the folder where there are; a folder of label maps alone is scored without
    calibration (the probabilities are then None)."""

    format = "mcseg"

    def __init__(self, path: Path, task: Task, probs_dir: Path | None = None) -> None:
        self.probs_dir = Path(probs_dir) if probs_dir is not None else None
        super().__init__(path, task)

    def _scan(self) -> dict[str, Path]:
        self.label_maps = _case_files(self.path)
        probs = _case_files(self.probs_dir or self.path, "_probs")
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

    def _label_map(self, case: str, label: Volume, label_path: Path) -> torch.Tensor | None:
        path = self.label_maps.get(case)
        if path is None:
            return None
        vol = read_volume(path, len(label.spacing))
        _same_grid(case, "prediction", path, vol.spatial_shape, vol.spacing, vol.affine, label, label_path)
        arr = np.asarray(vol.array)
        if self.task.multilabel and arr.ndim == len(label.spacing) + 1:
            arr = np.moveaxis(arr, -1, 0)  # mcseg writes multi-label predictions channel last
        elif arr.ndim != len(label.spacing):
            raise FolderError(f"case {case}: {path.name} has shape {arr.shape}; a label map has one value per voxel")
        if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.round(arr)):
            raise FolderError(f"case {case}: {path.name} holds non-integer values; expected a label map")
        return torch.from_numpy(arr.astype(np.int64))


def open_folder(path: str | Path, task: Task, fmt: str = "auto", monai_postfix: str = "trans",
                probs_dir: Path | None = None) -> PredictionFolder:
    """The prediction folder ``path`` in its format (detected, or stated and checked); ``probs_dir``: mcseg's
    ``<case>_probs`` in another folder than the label maps of ``path``."""
    if probs_dir is not None:
        if fmt not in ("auto", "mcseg"):
            raise FolderError(f"--probs is for mcseg's <case>_probs.nii.gz, not --format {fmt}")
        return McsegFolder(Path(path), task, probs_dir)
    fmt = detect_format(Path(path), fmt, monai_postfix)
    if fmt == "nnunet":
        return NnUNetFolder(Path(path), task)
    if fmt == "monai":
        return MonaiFolder(Path(path), task, monai_postfix)
    return McsegFolder(Path(path), task)


def select_cases(folders: Sequence[PredictionFolder], reference: Reference, cases: Sequence[str] | None = None,
                 allow_missing: bool = False) -> list[str]:
    """The cases to evaluate: ``cases`` (a fold's), else every case of the first folder; each must be in every
    folder and in the reference; reference cases without a prediction are an error unless ``allow_missing``
    or ``cases`` chose them."""
    first = folders[0]
    chosen = sorted(cases) if cases is not None else first.cases()
    if not chosen:
        raise FolderError(f"{first.path}: no cases to evaluate")
    for folder in folders:
        missing = [c for c in chosen if c not in folder.files]
        if missing:
            raise FolderError(f"{len(missing)} case(s) without a prediction in {folder.path}: {', '.join(missing[:10])}")
        if cases is not None:
            continue
        extra = sorted(set(folder.cases()) - set(chosen))
        if extra:
            raise FolderError(f"{folder.path} holds {len(extra)} case(s) that {first.path} lacks: {', '.join(extra[:10])}")
    unlabelled = [c for c in chosen if c not in reference.labels]
    if unlabelled:
        raise FolderError(f"{len(unlabelled)} prediction(s) without a label in {reference.root}: "
                          f"{', '.join(unlabelled[:10])}")
    unpredicted = sorted(set(reference.labels) - set(chosen))
    if unpredicted and cases is None and not allow_missing:
        raise FolderError(f"{len(unpredicted)} label(s) without a prediction in {first.path}: "
                          f"{', '.join(unpredicted[:10])} (pass --allow-missing to evaluate the others, or "
                          f"--splits/--fold to name the cases)")
    return chosen


def read_case(folders: Sequence[PredictionFolder], reference: Reference, case: str,
              members: MemberAccumulator | None = None):
    """The case's label volume, evaluator label, pooled probabilities (``C x *S`` tensor), the tool's own label
    map (one folder only) and the files read; with ``members``, each folder's probabilities are added to it."""
    label_vol, label = reference.load(case)
    files = [reference.labels[case]]
    preds = []
    for folder in folders:
        pred = folder.read(case, label_vol, reference.labels[case])
        files += pred.files
        preds.append(pred)
        if pred.probs is None and len(folders) > 1:
            raise FolderError(f"{folder.path}: an ensemble member needs probabilities, the folder has label maps only")
        if members is not None and pred.probs is not None:
            members.add(torch.from_numpy(pred.probs))
    if preds[0].probs is None:
        probs = None
    else:
        probs = members.mean() if members is not None else torch.from_numpy(preds[0].probs)
    prediction = preds[0].prediction if len(preds) == 1 else None
    return label_vol, label, probs, prediction, files


def distinct_members(folders: Sequence[PredictionFolder], cases: Sequence[str]) -> None:
    """An ensemble's members must differ: a folder listed twice, or two folders whose files of ``cases`` are
    byte-identical (sha256 over each case's files), would count one prediction as several members (as
    evaluate.py refuses checkpoints with identical weights)."""
    import hashlib

    paths: dict[Path, PredictionFolder] = {}
    digests: dict[str, PredictionFolder] = {}
    for folder in folders:
        path = Path(folder.path).resolve()
        if path in paths:
            raise FolderError(f"--ensemble: {folder.path} is listed twice (also as {paths[path].path}): a folder with "
                              f"itself is the folder alone; list each member once")
        paths[path] = folder
        digest = hashlib.sha256()
        for case in cases:
            for file in folder.case_files(case):
                digest.update(f"{case}\n{file_sha256(file)}\n".encode())
        key = digest.hexdigest()
        if key in digests:
            raise FolderError(f"--ensemble: {digests[key].path} and {folder.path} hold identical files for the "
                              f"{len(cases)} case(s) (sha256 {key[:8]}): an ensemble of copies is the one prediction "
                              f"folder; evaluate it alone")
        digests[key] = folder


def evaluate_folders(folders: Sequence[PredictionFolder], reference: Reference, protocol: EvalProtocol,
                     output_dir: Path, cases: Sequence[str] | None = None, allow_missing: bool = False,
                     uncertainty_dir: Path | None = None, selection: dict | None = None,
                     overwrite: bool = False) -> dict:
    """Evaluate one prediction folder, or the ensemble of several (probabilities averaged, the members' PE / EE /
    MI maps), against ``reference`` with ``protocol``: the evaluator's files plus ``provenance.json`` (tool,
    version where the files say it, the sha256 of every file read) and failure detection; returns the summary.
    ``output_dir`` follows :mod:`mcseg.evaluation.folder_outputs` (an earlier evaluation replaced only with
    ``overwrite``; marked in status.json while written)."""
    for folder in folders:
        unfinished = folder_status(folder.path)
        if unfinished is not None and unfinished["status"] != "completed":
            raise FolderError(f"{folder.path}: {unfinished['tool']} did not complete this folder ({STATUS_FILE}: "
                              f"{unfinished['status']}): run its command again before evaluating it")
    chosen = select_cases(folders, reference, cases, allow_missing)
    if len(folders) > 1:
        distinct_members(folders, chosen)
    with_probs = not isinstance(folders[0], McsegFolder) or folders[0].has_probs
    if uncertainty_dir is not None and not with_probs:
        raise FolderError("uncertainty maps (--save-uncertainty) need the probability maps (--probs)")
    out = Path(output_dir)
    postfix = getattr(folders[0], "postfix", "trans")
    earlier = claim_output(out, EVALUATE_TOOL, overwrite, lambda folder: prediction_files(folder, postfix))
    record = {"predictions": [str(Path(f.path).resolve()) for f in folders], "reference": str(reference.root.resolve())}
    with writing(out, EVALUATE_TOOL, record, EVALUATION_FILES if earlier is not None else ()):
        return _evaluate(folders, reference, protocol, out, chosen, uncertainty_dir, selection, with_probs)


def _evaluate(folders: Sequence[PredictionFolder], reference: Reference, protocol: EvalProtocol, out: Path,
              chosen: list[str], uncertainty_dir: Path | None, selection: dict | None, with_probs: bool) -> dict:
    """:func:`evaluate_folders` once its output folder is owned: read, score and write."""
    task = reference.task
    evaluator = Evaluator(task.channels, task.class_names, protocol, task.multilabel)
    failure = FailureDetection(MAPS) if protocol.failure_detection and with_probs else None
    inputs: list[Path] = [*reference.files, *(f for folder in folders for f in folder.config_files())]
    for case in chosen:
        members = MemberAccumulator(task.multilabel)
        label_vol, label, probs, prediction, files = read_case(folders, reference, case, members)
        inputs += files
        try:
            row = evaluator.add_case(case, probs, label, label_vol.spacing, prediction=prediction)
        except ValueError as exc:
            raise FolderError(str(exc)) from None
        if probs is None:
            continue
        pred = prediction if prediction is not None else (
            (probs > 0.5).long() if task.multilabel else probs.argmax(0))
        maps = members.maps()
        if failure is not None:
            errors = (pred != label).any(0) if task.multilabel else pred != label
            failure.add_case(case, normalise(maps, probs.shape[0], task.multilabel), errors,
                             evaluator.region_of(label, pred, label_vol.spacing), 1.0 - row["mean_foreground_dice"])
        if uncertainty_dir is not None:
            for name, suffix in UNCERTAINTY_FILES.items():
                if len(folders) > 1 or name == "predictive_entropy":
                    write_nifti(Path(uncertainty_dir) / f"{case}_{suffix}.nii.gz", maps[name].numpy(),
                                label_vol.affine, reference.labels[case])
    identities = [folder.identity() for folder in folders]
    provenance = {
        "predictions": identities,
        "reference": {"path": str(reference.root.resolve()), "kind": reference.kind},
        "cases": chosen, **({"selection": selection} if selection else {}),
        "input_files_sha256": {str(p.resolve()): file_sha256(p) for p in dict.fromkeys(inputs)},
    }
    scored_fit = sorted({c for i in identities for c in (i.get("calibration") or {}).get("fit_cases_calibrated") or []
                         if c in chosen})
    if scored_fit:
        provenance["scored_fit_cases"] = scored_fit
        provenance["warnings"] = [f"{len(scored_fit)} scored case(s) ({', '.join(scored_fit[:10])}) are cases the "
                                  f"calibration of the predictions was fitted on (their calibration.json 'applied'): "
                                  f"their calibration figures measure the fit, not unseen cases"]
    extra = {"provenance": provenance}
    if len(folders) > 1:
        extra["predictor"] = {"members": len(folders), "pooled": "probabilities",
                              "note": "the folders' saved probabilities averaged (nnU-Net's own fold ensemble "
                                      "averages logits inside one predictor)"}
    if failure is not None:
        extra["failure_detection"] = failure.summary()
    summary = evaluator.write(out, extra=extra)
    if failure is not None and failure.rows:
        write_csv(out / FAILURE_FILE, failure.rows)
    write_json(out / PROVENANCE_FILE, provenance)
    return summary

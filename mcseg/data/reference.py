"""Reference datasets of another tool's predictions: their labels, what the classes are, and nnU-Net's folds.

A reference (:func:`read_reference`) is an nnU-Net raw dataset (``dataset.json`` with ``channel_names``, labels
in ``labelsTr/<case><file_ending>``), a Medical Segmentation Decathlon folder (``dataset.json`` with
``training``), or a plain folder of ``<case>.nii.gz`` label maps (classes from ``dataset.json`` beside it or one
folder up, nnU-Net's ``{name: value}`` or MSD's ``{value: name}``). nnU-Net's ``splits_final.json`` selects the
validation cases of a fold (:func:`fold_cases`). The prediction folders read against it:
:mod:`mcseg.evaluation.formats`.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mcseg.data.cases import to_regions
from mcseg.data.io import Volume, read_volume

__all__ = ["DERIVED", "FolderError", "Reference", "SUFFIXES", "Task", "case_volumes", "classes_options", "fold_cases",
           "read_json", "read_reference", "task_from_labels", "task_of_json"]

SUFFIXES = (".nii.gz", ".nii", ".mha", ".nrrd")
# mcseg's files derived from a prediction, beside its label maps: not cases of a labels folder
DERIVED = ("_probs", "_entropy", "_expected_entropy", "_mutual_information")


class FolderError(ValueError):
    """The folders cannot be evaluated together; the message names the case or file."""


def case_volumes(folder: Path, tag: str = "", derived_ok: bool = False) -> dict[str, Path]:
    """``{case: path}`` of the volumes of ``folder`` named ``<case><tag><suffix>`` (without ``tag``: files not
    ending in a derived tag such as ``_probs``)."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a folder")
    files: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        suffix = next((s for s in SUFFIXES if path.name.endswith(s)), None)
        if suffix is None or not path.is_file():
            continue
        stem = path.name[: -len(suffix)]
        if tag:
            if stem.endswith(tag):
                files[stem[: -len(tag)]] = path
        elif derived_ok or not stem.endswith(DERIVED):
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


def task_of_json(path: Path) -> Task:
    desc = read_json(path)
    if not isinstance(desc.get("labels"), dict):
        raise FolderError(f"{path}: no 'labels' entry")
    return task_from_labels(desc["labels"], path, desc.get("regions_class_order"))


def read_json(path: Path) -> dict:
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
    predictions come with (:func:`mcseg.evaluation.formats.declared_classes`), suggested when nothing says the
    classes."""
    root = Path(path)
    if not root.is_dir():
        raise FolderError(f"{root}: the reference is not a folder")
    desc_path = root / "dataset.json"
    desc = read_json(desc_path) if desc_path.is_file() else None
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
            case = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), label.stem)
            labels[case] = label
        kind, task_json = "msd", desc_path
    else:
        labels = case_volumes(root)
        kind = "labels"
        task_json = next((p for p in (root / "dataset.json", root.parent / "dataset.json") if p.is_file()), None)
    task_json = Path(dataset_json) if dataset_json is not None else task_json
    if task_json is not None:
        task = task_of_json(task_json)
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


def _classes_advice(declared: Path | None) -> str:
    """What to pass when nothing says the classes: the predictions' own dataset.json where they have one (its
    class names for a label-based task), else the number of classes or their names."""
    if declared is not None:
        try:
            task = task_of_json(declared)
        except FolderError:
            task = None
        if task is not None:
            return (f"the predictions declare {task.describe()} in {declared}: if the labels are these, pass "
                    f"{classes_options(declared, task)}")
    return "pass --num-classes K (background included) or --class-names NAME ... (background first)"


def classes_options(declared: Path, task: Task) -> str:
    """The options that give a reference ``declared``'s classes, each in backquotes, ready to paste."""
    import shlex

    names = "" if task.multilabel else f" or `{shlex.join(['--class-names', *task.class_names])}`"
    return f"`--dataset-json {shlex.quote(str(declared))}`{names}"


def fold_cases(splits_file: str | Path, fold: int | str, part: str = "val") -> list[str]:
    """The ``part`` (val | train) cases of fold ``fold`` of nnU-Net's ``splits_final.json``; ``fold="all"``: the
    union of every fold's validation cases (each training case once, out of fold)."""
    path = Path(splits_file)
    splits = read_json(path)
    if not isinstance(splits, list) or not all(isinstance(s, dict) and part in s for s in splits):
        raise FolderError(f"{path}: expected nnU-Net's list of {{'train': [...], 'val': [...]}} per fold")
    if str(fold) == "all":
        return sorted({c for s in splits for c in s[part]})
    k = int(fold)
    if not 0 <= k < len(splits):
        raise FolderError(f"{path}: fold {k} does not exist ({len(splits)} folds)")
    return sorted(str(c) for c in splits[k][part])

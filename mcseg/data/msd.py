"""Medical Segmentation Decathlon folders: ``dataset.json``, ``imagesTr/``, ``labelsTr/``."""
from __future__ import annotations

import json
from pathlib import Path

from mcseg.data.base import SegmentationDataset, inside_root, resolve_root
from mcseg.data.cases import CaseRef


def _case_id(path: str) -> str:
    name = Path(path).name
    for ext in (".nii.gz", ".nii", ".mha", ".nrrd"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return Path(name).stem


class MSDDataset(SegmentationDataset):
    """Any decathlon-style task; 3D images, or 4D with modalities on the last axis.

    ``num_classes``, ``class_names`` and ``in_channels`` default to what ``dataset.json``
    declares (``labels``, ``modality``); when given in config they must agree with it. A ``training``
    entry whose ``label`` is a list of files is a case with one label map per rater, named by the files'
    ``labelsTr_<name>`` folders when each lies in its own, else ``rater0``, ``rater1``, ...
    """

    def __init__(self, root: str, name: str = "msd", **kwargs) -> None:
        self.root = resolve_root(root)
        self.json_path = self.root / "dataset.json"
        if not self.json_path.is_file():
            raise FileNotFoundError(f"dataset.root={root}: no dataset.json in {self.root}")
        try:
            self.description = json.loads(self.json_path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.json_path}: invalid JSON ({exc})") from exc
        labels = self.description.get("labels")
        modality = self.description.get("modality") or self.description.get("channel_names")
        if not isinstance(labels, dict) or "training" not in self.description:
            raise ValueError(f"{self.json_path}: expected 'labels' and 'training' entries")
        declared_names = [labels[k] for k in sorted(labels, key=int)]
        region_view = bool(kwargs.get("regions"))  # multi-label view: classes are regions of the labels
        for key, given, declared in (
            ("num_classes", None if region_view else kwargs.get("num_classes"), len(declared_names)),
            ("in_channels", kwargs.get("in_channels"), len(modality) if modality else None),
        ):
            if given is not None and declared is not None and given != declared:
                raise ValueError(f"dataset.{key}={given} but {self.json_path} declares {declared}")
        if not region_view:
            kwargs["num_classes"] = kwargs.get("num_classes") or len(declared_names)
            kwargs["class_names"] = kwargs.get("class_names") or declared_names
        if kwargs.get("in_channels") is None and modality:
            kwargs["in_channels"] = len(modality)
        super().__init__(name=name, **kwargs)
        self.label_classes = len(declared_names)
        self._finalise_classes()

    @property
    def modality(self) -> str | None:
        """``CT`` or ``MRI`` from dataset.json's channel names, when they say (:func:`mcseg.data.shift.modality_of`)."""
        from mcseg.data.shift import modality_of

        return modality_of((self.description.get("modality") or self.description.get("channel_names") or {}).values())

    def case_refs(self) -> list[CaseRef]:
        refs = []
        for entry in self.description["training"]:
            image = inside_root(self.root, entry["image"], self.json_path)
            if isinstance(entry["label"], list):  # several raters: one label file each
                raters = tuple(inside_root(self.root, p, self.json_path) for p in entry["label"])
                refs.append(CaseRef(_case_id(entry["image"]), (image,), None, raters, _rater_names(raters)))
                continue
            label = inside_root(self.root, entry["label"], self.json_path)
            refs.append(CaseRef(_case_id(entry["image"]), (image,), label))
        ids = [r.case_id for r in refs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{self.json_path}: duplicate case ids in 'training'")
        return sorted(refs, key=lambda r: r.case_id)


def _rater_names(files) -> tuple[str, ...]:
    """Raters named by their folders where every file lies in its own ``labelsTr_<name>`` (the layout of
    nnU-Net's ``rater_folders``), else ``rater0``, ``rater1``, ... in the order listed."""
    folders = [Path(f).parent.name for f in files]
    if all(f.startswith("labelsTr_") and len(f) > len("labelsTr_") for f in folders) and len(set(folders)) == len(folders):
        return tuple(f.removeprefix("labelsTr_") for f in folders)
    return tuple(f"rater{r}" for r in range(len(files)))


"""BraTS (brain tumour MRI, four modalities) in the 2019, 2020 and 2021 folder layouts.

One folder per case, named after the case, anywhere up to three levels under the root:
2019 ``MICCAI_BraTS_2019_Data_Training/{HGG,LGG}/BraTS19_<inst>_<id>_1/``, 2020
``MICCAI_BraTS2020_TrainingData/BraTS20_Training_<nnn>/``, 2021 ``BraTS2021_<nnnnn>/``; in
each, ``<case>_{t1,t1ce,t2,flair,seg}.nii.gz`` (``.nii`` too). Labels 0, 1 necrotic and
non-enhancing core, 2 oedema, 4 enhancing tumour (3 unused): ``label_mapping: {4: 3}``
makes the classes contiguous. The region view (``brats_regions``) gives the evaluated
regions WT = {1, 2, 3}, TC = {1, 3}, ET = {3} (after the mapping) as multi-label targets.
The 2019 grade folders (HGG/LGG) stratify the split.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mcseg.data.base import SegmentationDataset, resolve_root
from mcseg.data.cases import CaseRef
from mcseg.data.files import find_volume, split_extension, visible_files
from mcseg.data.split import SplitInfo

CLASS_NAMES = ("background", "necrotic_core", "edema", "enhancing_tumor")
MODALITIES = ("t1", "t1ce", "t2", "flair")
LABEL_MAPPING = {4: 3}
REGIONS = {"WT": [1, 2, 3], "TC": [1, 3], "ET": [3]}
_EXTENSIONS = (".nii.gz", ".nii")


class BraTSDataset(SegmentationDataset):
    """A BraTS training folder as downloaded.

    Args:
        root: the training-data folder (it, or its sub-folders up to three levels, hold the case folders).
        modalities: file suffixes of the channels, in channel order.
        label_suffix: file suffix of the label map.
    """

    MODALITY = "MRI"

    def __init__(self, root: str, name: str = "brats", modalities: Sequence[str] = MODALITIES,
                 label_suffix: str = "seg", **kwargs) -> None:
        self.root = resolve_root(root)
        self.modalities = tuple(str(m) for m in modalities)
        if not self.modalities:
            raise ValueError("dataset.modalities: expected at least one modality")
        self.label_suffix = str(label_suffix)
        if kwargs.get("in_channels") is None:
            kwargs["in_channels"] = len(self.modalities)
        elif kwargs["in_channels"] != len(self.modalities):
            raise ValueError(f"dataset.in_channels={kwargs['in_channels']} but dataset.modalities lists "
                             f"{len(self.modalities)}: {list(self.modalities)}")
        if kwargs.get("label_mapping") is None and "label_mapping" not in kwargs:
            kwargs["label_mapping"] = LABEL_MAPPING
        if not kwargs.get("regions"):
            kwargs.setdefault("num_classes", len(CLASS_NAMES))
            if kwargs.get("class_names") is None:
                kwargs["class_names"] = list(CLASS_NAMES)
        super().__init__(name=name, **kwargs)
        if self.label_classes is None:
            self.label_classes = len(CLASS_NAMES)
        self._finalise_classes()
        self.stratum_of: dict[str, str] = {}

    def _case_folders(self) -> list[Path]:
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            depth = len(Path(dirpath).relative_to(self.root).parts)
            if depth >= 3:
                dirnames[:] = []
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            folder = Path(dirpath)
            if folder.name.lower().startswith("brats") and any(split_extension(f, _EXTENSIONS) for f in filenames):
                found.append(folder)
        return found

    def _label_path(self, folder: Path) -> Path:
        path = find_volume(folder, f"{folder.name}_{self.label_suffix}", _EXTENSIONS)
        if path.is_file():
            return path
        dashed = find_volume(folder, f"{folder.name}-{self.label_suffix}", _EXTENSIONS)
        if dashed.is_file():
            return dashed
        # BraTS 2020 case 355 ships its label as W39_1998.09.19_Segm.nii: accept one odd "seg" file
        odd = [p for p in visible_files(folder) if split_extension(p.name, _EXTENSIONS)
               and self.label_suffix.lower() in p.name.lower()]
        return odd[0] if len(odd) == 1 else path

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        refs, problems = [], []
        folders = self._case_folders()
        if not folders:
            problems.append(f"{self.root}: no BraTS case folders (BraTS*/ with <case>_flair.nii.gz ...) found")
        seen: dict[str, Path] = {}
        for folder in folders:
            case_id = folder.name
            if case_id in seen:
                problems.append(f"{folder}: case {case_id} also in {seen[case_id]}")
                continue
            seen[case_id] = folder
            images = []
            for mod in self.modalities:
                path = find_volume(folder, f"{case_id}_{mod}", _EXTENSIONS)
                dashed = find_volume(folder, f"{case_id}-{mod}", _EXTENSIONS)
                images.append(dashed if not path.is_file() and dashed.is_file() else path)
            refs.append(CaseRef(case_id, tuple(images), self._label_path(folder)))
            grade = folder.parent.name.upper()
            if grade in ("HGG", "LGG"):
                self.stratum_of[case_id] = grade
        return sorted(refs, key=lambda r: r.case_id), problems

    def split_info(self) -> SplitInfo | None:
        refs = self.case_refs()
        if not self.stratum_of:
            return None
        return SplitInfo(strata={r.case_id: self.stratum_of.get(r.case_id, "") for r in refs})

"""FLARE 2021 (abdominal CT): ``TrainingImg/train_XXX_0000.nii.gz`` and ``TrainingMask/train_XXX.nii.gz``.

Labels 0 background, 1 liver, 2 kidneys, 3 spleen, 4 pancreas. The images are CT in
Hounsfield units: the preset clips them to an abdominal soft-tissue window before the
z-score (``dataset.normalization.clip``).
"""
from __future__ import annotations

from mcseg.data.base import SegmentationDataset, resolve_root
from mcseg.data.cases import CaseRef
from mcseg.data.files import channel_cases

CLASS_NAMES = ("background", "liver", "kidney", "spleen", "pancreas")


class FLAREDataset(SegmentationDataset):
    """The FLARE 2021 training download.

    Args:
        root: the folder holding ``TrainingImg/`` and ``TrainingMask/``.
        image_dir, label_dir: their names, for re-packaged copies.
    """

    MODALITY = "CT"

    def __init__(self, root: str, name: str = "flare", image_dir: str = "TrainingImg",
                 label_dir: str = "TrainingMask", file_ending: str = ".nii.gz", **kwargs) -> None:
        self.root = resolve_root(root)
        self.image_dir, self.label_dir, self.file_ending = self.root / image_dir, self.root / label_dir, file_ending
        if not self.image_dir.is_dir():
            raise FileNotFoundError(f"dataset.root={root}: no {image_dir}/ folder in {self.root}")
        kwargs.setdefault("num_classes", len(CLASS_NAMES))
        if kwargs.get("class_names") is None:
            kwargs["class_names"] = list(CLASS_NAMES)
        super().__init__(name=name, **kwargs)
        self._finalise_classes()

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        return channel_cases(self.image_dir, self.label_dir, self.in_channels or 1, self.file_ending)

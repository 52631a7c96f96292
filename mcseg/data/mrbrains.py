"""MRBrainS (brain MRI: T1, T1-IR, FLAIR) in its 2013 and 2018 layouts; grey matter, white matter, CSF.

2013: ``TrainingData/<n>/{T1,T1_IR,T2_FLAIR}.nii`` (registered to the FLAIR, 0.958 x 0.958
x 3.0 mm) with ``LabelsForTesting.nii`` (1 CSF, 2 grey matter, 3 white matter; the
evaluation labels). 2018: ``training/<n>/pre/{reg_T1,reg_IR,FLAIR}.nii.gz`` with
``segm.nii.gz`` (1 cortical grey matter, 2 basal ganglia, 3 white matter, 4 white-matter
lesions, 5 extracerebral CSF, 6 ventricles, 7 cerebellum, 8 brain stem, 9 infarction,
10 other), merged into the three tissues as the challenge evaluates them (cerebellum,
brain stem, infarction and other become background). Classes here: 0 background,
1 grey matter, 2 white matter, 3 CSF.
"""
from __future__ import annotations

from pathlib import Path

from mcseg.data.base import SegmentationDataset, resolve_root
from mcseg.data.cases import CaseRef
from mcseg.data.files import VOLUME_EXTENSIONS, find_volume

CLASS_NAMES = ("background", "grey_matter", "white_matter", "csf")
EDITIONS = {
    "2013": {
        "folder": "TrainingData",
        "channels": ("T1", "T1_IR", "T2_FLAIR"),
        "label": "LabelsForTesting",
        "label_mapping": {1: 3, 2: 1, 3: 2},
        "extensions": (".nii", ".nii.gz", ".mhd", ".mha"),
    },
    "2018": {
        "folder": "training",
        "channels": ("pre/reg_T1", "pre/reg_IR", "pre/FLAIR"),
        "label": "segm",
        "label_mapping": {1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3, 7: 0, 8: 0, 9: 0, 10: 0},
        "extensions": (".nii.gz", ".nii"),
    },
}


def _volume(subject: Path, relative: str, extensions=VOLUME_EXTENSIONS) -> Path:
    rel = Path(relative)
    return find_volume(subject / rel.parent, rel.name, extensions)


class MRBrainSDataset(SegmentationDataset):
    """An MRBrainS download.

    Args:
        root: the folder holding ``TrainingData/`` (2013) or ``training/`` (2018), or that folder itself.
        edition: ``2013``, ``2018`` or ``auto`` (from the folder layout).
    """

    MODALITY = "MRI"

    def __init__(self, root: str, name: str = "mrbrains", edition: str = "auto", **kwargs) -> None:
        self.root = resolve_root(root)
        self.edition, self.subjects_dir = self._detect(str(edition), root)
        spec = EDITIONS[self.edition]
        if kwargs.get("label_mapping") is None:
            kwargs["label_mapping"] = spec["label_mapping"]
        kwargs.setdefault("num_classes", len(CLASS_NAMES))
        if kwargs.get("class_names") is None:
            kwargs["class_names"] = list(CLASS_NAMES)
        if kwargs.get("in_channels") is None:
            kwargs["in_channels"] = len(spec["channels"])
        super().__init__(name=name, **kwargs)
        self._finalise_classes()

    def _detect(self, edition: str, given: str) -> tuple[str, Path]:
        if edition not in ("auto", *EDITIONS):
            raise ValueError(f"dataset.edition={edition!r}: expected auto, 2013 or 2018")
        candidates = [edition] if edition != "auto" else list(EDITIONS)
        for ed in candidates:
            folder = self.root / EDITIONS[ed]["folder"]
            if folder.is_dir():
                return ed, folder
        for ed in candidates:  # the root is the subjects folder itself
            if any(_volume(s, EDITIONS[ed]["channels"][0]).is_file() for s in self.root.iterdir() if s.is_dir()):
                return ed, self.root
        raise FileNotFoundError(
            f"dataset.root={given}: no MRBrainS subjects in {self.root} (expected TrainingData/<n>/T1.nii for "
            "2013 or training/<n>/pre/FLAIR.nii.gz for 2018)"
        )

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        spec = EDITIONS[self.edition]
        refs = []
        for subject in sorted(p for p in self.subjects_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            images = tuple(_volume(subject, c, spec["extensions"]) for c in spec["channels"])
            refs.append(CaseRef(subject.name, images, _volume(subject, spec["label"], spec["extensions"])))
        problems = [] if refs else [f"{self.subjects_dir}: no subject folders"]
        return refs, problems

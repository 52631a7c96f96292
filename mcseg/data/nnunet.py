"""nnU-Net v2 raw dataset folders: ``dataset.json``, ``imagesTr/<case>_XXXX<ending>``, ``labelsTr/<case><ending>``.

``dataset.json`` gives ``channel_names`` (``{"0": "T2", "1": "ADC"}``), ``labels`` (name ->
value, ``{"background": 0, "PZ": 1, "TZ": 2}``; region-based datasets give lists,
``{"background": 0, "whole tumor": [1, 2, 3], ...}``), ``file_ending`` and ``numTraining``;
an optional ``dataset`` entry lists each case's ``images`` and ``label`` explicitly
(paths relative to the dataset folder). Region-based datasets are read as multi-label
(one sigmoid per region) unless ``multilabel: false`` asks for the plain label values.

Several raters: ``rater_folders`` names one labels folder per rater (``[labelsTr_A, labelsTr_B]``, or
``auto`` for every ``labelsTr_*`` folder), each holding ``<case><ending>``; in the ``dataset`` entry a
case's ``label`` may be a list of files, one per rater.
"""
from __future__ import annotations

import json

from mcseg.data.base import SegmentationDataset, inside_root, resolve_root
from mcseg.text import plural
from mcseg.data.cases import CaseRef
from mcseg.data.files import channel_cases


class NnUNetDataset(SegmentationDataset):
    """An nnU-Net v2 raw dataset (``nnUNet_raw/DatasetXXX_Name``).

    ``num_classes``, ``class_names``, ``in_channels`` and the regions come from
    ``dataset.json`` when not given; when given they must agree with it.
    """

    def __init__(self, root: str, name: str = "nnunet", multilabel: bool | None = None,
                 rater_folders: list[str] | str | None = None, **kwargs) -> None:
        self.root = resolve_root(root)
        self.rater_folders = _rater_folders(self.root, rater_folders)
        self.json_path = self.root / "dataset.json"
        if not self.json_path.is_file():
            raise FileNotFoundError(f"dataset.root={root}: no dataset.json in {self.root}")
        try:
            desc = json.loads(self.json_path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.json_path}: invalid JSON ({exc})") from exc
        self.description = desc
        channels = desc.get("channel_names") or desc.get("modality")
        labels = desc.get("labels")
        if not isinstance(channels, dict) or not channels or not isinstance(labels, dict) or not labels:
            raise ValueError(f"{self.json_path}: expected 'channel_names' and 'labels' entries (nnU-Net v2 format)")
        self.file_ending = str(desc.get("file_ending", ".nii.gz"))
        try:
            values = {str(k): ([int(x) for x in v] if isinstance(v, list) else int(v)) for k, v in labels.items()}
        except (TypeError, ValueError):
            raise ValueError(f"{self.json_path}: 'labels' must map names to integers or lists of integers") from None
        ints = sorted({x for v in values.values() for x in (v if isinstance(v, list) else [v])})
        region_based = any(isinstance(v, list) for v in values.values())
        n_channels = len(channels)
        if kwargs.get("in_channels") not in (None, n_channels):
            raise ValueError(f"dataset.in_channels={kwargs['in_channels']} but {self.json_path} declares {n_channels}")
        kwargs["in_channels"] = n_channels
        multilabel = region_based if multilabel is None else bool(multilabel)
        if multilabel:
            if not region_based and not kwargs.get("regions"):
                raise ValueError(f"dataset.multilabel=true but {self.json_path} declares no regions (label lists)")
            if not kwargs.get("regions"):
                kwargs["regions"] = {k: (v if isinstance(v, list) else [v]) for k, v in values.items()
                                     if v != 0 and v != [0]}
            kwargs.setdefault("num_classes", None)
        else:
            declared = len(ints) if not region_based else max(ints) + 1
            if not region_based and ints != list(range(len(ints))):
                raise ValueError(f"{self.json_path}: label values {ints} must be consecutive from 0")
            if kwargs.get("num_classes") not in (None, declared):
                raise ValueError(f"dataset.num_classes={kwargs['num_classes']} but {self.json_path} declares {declared}")
            kwargs["num_classes"] = declared
            if kwargs.get("class_names") is None:
                by_value = {v: k for k, v in values.items() if not isinstance(v, list)}
                kwargs["class_names"] = [by_value.get(i, f"label_{i}") for i in range(declared)]
        super().__init__(name=name, multilabel=multilabel, **kwargs)
        self.label_classes = max(ints) + 1
        self._finalise_classes()

    @property
    def modality(self) -> str | None:
        """``CT`` or ``MRI`` from dataset.json's channel names, when they say (:func:`mcseg.data.shift.modality_of`)."""
        from mcseg.data.shift import modality_of

        return modality_of((self.description.get("channel_names") or self.description.get("modality") or {}).values())

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        listed = self.description.get("dataset")
        if isinstance(listed, dict):
            refs = []
            for case_id, entry in sorted(listed.items()):
                images = tuple(inside_root(self.root, p, self.json_path) for p in entry.get("images", []))
                label = entry.get("label")
                if isinstance(label, list):  # one file per rater
                    raters = tuple(inside_root(self.root, p, self.json_path) for p in label)
                    refs.append(CaseRef(str(case_id), images, None, raters, tuple(f"rater{r}" for r in range(len(raters)))))
                    continue
                refs.append(CaseRef(str(case_id), images,
                                    inside_root(self.root, label, self.json_path) if label else None))
            return refs, []
        if self.rater_folders:
            refs, problems = channel_cases(self.root / "imagesTr", None, self.in_channels, self.file_ending)
            names = tuple(f.removeprefix("labelsTr_") for f in self.rater_folders)
            problems += [f"{self.root / f}: rater label folder not found" for f in self.rater_folders
                         if not (self.root / f).is_dir()]
            refs = [CaseRef(r.case_id, r.image_paths, None,
                            tuple(self.root / f / f"{r.case_id}{self.file_ending}" for f in self.rater_folders), names)
                    for r in refs]
        else:
            refs, problems = channel_cases(self.root / "imagesTr", self.root / "labelsTr", self.in_channels,
                                           self.file_ending)
        declared = self.description.get("numTraining")
        if isinstance(declared, int) and declared != len(refs):
            self.note(f"{self.json_path}: numTraining={declared} but {plural(len(refs), 'case')} found in "
                      "imagesTr/labelsTr")
        return refs, problems


def _rater_folders(root, folders) -> list[str]:
    """``dataset.rater_folders``: ``auto`` finds every ``labelsTr_*`` folder; a list is taken as given."""
    if folders in (None, "", []):
        return []
    if folders == "auto":
        found = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("labelsTr_"))
        if not found:
            raise FileNotFoundError(f"dataset.rater_folders=auto: no labelsTr_* folder in {root}")
        return found
    if isinstance(folders, str) or not all(isinstance(f, str) and f for f in folders):
        raise ValueError(f"dataset.rater_folders={folders!r}: expected auto or a list of folder names")
    return list(folders)

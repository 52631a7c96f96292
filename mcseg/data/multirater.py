"""Datasets whose cases carry several raters' label maps, in case folders: QUBIQ and CURVAS.

Both keep one folder per case holding the image and one label file per rater; the number of raters may
differ between tasks and cases (QUBIQ prostate: one case has 5 raters where the others have 6). Every rater
map is checked as a label is (:mod:`mcseg.data.validate`), errors naming the case and the rater; the hard
label of a case is derived from its raters (:mod:`mcseg.data.raters`).

- **QUBIQ** (MICCAI 2020/2021): ``<dataset>/{Training,Validation}/case<NN>/image.nii.gz`` and
  ``task<TT>_seg<RR>.nii.gz`` (1-based, two digits); one binary task at a time (``dataset.task``).
- **CURVAS** (MICCAI 2024; 2025 PDACVI): ``{training,validation,testing}_set/<case>/image.nii.gz`` and
  ``annotation_<r>.nii.gz`` (three raters in 2024, labels 1 pancreas, 2 kidney, 3 liver; five in 2025).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from mcseg.data.base import SegmentationDataset, resolve_root
from mcseg.data.cases import CaseRef
from mcseg.data.files import visible_files, visible_folders
from mcseg.data.split import SplitInfo
from mcseg.text import plural


def rater_case_folder(folder: Path, case_id: str, image_names: Sequence[str], rater: re.Pattern,
                      problems: list[str]) -> CaseRef | None:
    """The case of one folder: its image (the first of ``image_names`` present) and every file whose name
    matches ``rater`` (group 1: the rater's number), sorted by that number. ``None`` (and a problem) when the
    folder lacks the image or every rater file."""
    files = {p.name: p for p in visible_files(folder)}
    image = next((files[n] for n in image_names if n in files), None)
    found = sorted((int(m.group(1)), m.group(0), path) for name, path in files.items()
                   if (m := rater.fullmatch(name)) is not None)
    if image is None:
        problems.append(f"{folder}: no image file (expected {' or '.join(image_names)})")
        return None
    if not found:
        problems.append(f"{folder}: no rater label file (expected names matching {rater.pattern})")
        return None
    names = tuple(_rater_name(n) for _, n, _ in found)
    return CaseRef(case_id, (image,), None, tuple(p for _, _, p in found), names)


def _rater_name(file_name: str) -> str:
    for ext in (".nii.gz", ".nii", ".mha", ".nrrd"):
        if file_name.endswith(ext):
            return file_name[: -len(ext)]
    return file_name


class _CaseFolders(SegmentationDataset):
    """Case folders grouped in parts (training, validation, testing); one part may be the official test set."""

    parts: tuple[str, ...] = ()
    test_part: str | None = None

    def __init__(self, root: str, name: str, official_split: bool = True, **kwargs) -> None:
        self.root = resolve_root(root)
        self.official_split = bool(official_split)
        self.test_ids: list[str] = []
        super().__init__(name=name, **kwargs)
        self._finalise_classes()

    def _part_cases(self, part: Path, part_name: str, problems: list[str]) -> list[CaseRef]:
        raise NotImplementedError

    def _part_folder(self, part: str) -> Path | None:
        folder = self.root / part
        if (folder / part).is_dir():  # a zip unpacked into a folder of its own name
            folder = folder / part
        return folder if folder.is_dir() else None

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        refs, problems = [], []
        self.test_ids = []
        for part in self.parts:
            folder = self._part_folder(part)
            if folder is None:
                continue
            cases = self._part_cases(folder, part, problems)
            refs += cases
            if part == self.test_part:
                self.test_ids = [r.case_id for r in cases]
        if not refs and not problems:
            problems.append(f"dataset.root={self.root}: no case folders in any of {', '.join(self.parts)}")
        ids = [r.case_id for r in refs]
        if len(set(ids)) != len(ids):
            problems.append(f"dataset.root={self.root}: the same case id in several parts")
        counts = sorted({len(r.raters) for r in refs})
        if len(counts) > 1:
            self.note(f"{self.root}: cases have {' or '.join(map(str, counts))} raters")
        return sorted(refs, key=lambda r: r.case_id), problems

    def split_info(self) -> SplitInfo | None:
        if not self.official_split or not self.test_ids:
            return None
        return SplitInfo(test=list(self.test_ids))


class QUBIQDataset(_CaseFolders):
    """One task of a QUBIQ dataset (prostate, brain-growth, brain-tumor, kidney; 2021: pancreas...).

    Args:
        root: the dataset's folder, holding ``Training/`` and ``Validation/``.
        task: the task number (``task01`` files are task 1); binary: background and ``class_names[1]``.
        official_split: the ``Validation`` cases are the test set (their labels are published).
    """

    parts = ("Training", "Validation")
    test_part = "Validation"

    def __init__(self, root: str, task: int = 1, name: str = "qubiq", **kwargs) -> None:
        if not isinstance(task, int) or task < 1:
            raise ValueError(f"dataset.task={task!r}: expected a task number >= 1")
        self.task = task
        kwargs.setdefault("num_classes", 2)
        if kwargs.get("class_names") is None:
            kwargs["class_names"] = ["background", f"task{task:02d}"]
        super().__init__(root, name=name, **kwargs)

    def _part_cases(self, part: Path, part_name: str, problems: list[str]) -> list[CaseRef]:
        pattern = re.compile(rf"task{self.task:02d}_seg(\d+)\.nii(?:\.gz)?")
        refs = []
        for folder in visible_folders(part):
            if folder.name.startswith("case"):
                ref = rater_case_folder(folder, f"{part_name.lower()}_{folder.name}", ("image.nii.gz", "image.nii"),
                                        pattern, problems)
                if ref is not None:
                    refs.append(ref)
        return refs


class CURVASDataset(_CaseFolders):
    """CURVAS: ``{training,validation,testing}_set/<case>/image.nii.gz`` with ``annotation_<r>.nii.gz``.

    Args:
        root: the folder holding ``training_set/`` (and ``validation_set/``, ``testing_set/``) as unzipped
            (a ``training_set/training_set/`` nesting is accepted).
        official_split: the ``testing_set`` cases are the test set when present.
    """

    parts = ("training_set", "validation_set", "testing_set")
    test_part = "testing_set"

    def __init__(self, root: str, name: str = "curvas", **kwargs) -> None:
        super().__init__(root, name=name, **kwargs)

    def _part_cases(self, part: Path, part_name: str, problems: list[str]) -> list[CaseRef]:
        pattern = re.compile(r"annotation_(\d+)\.nii(?:\.gz)?")
        refs = [rater_case_folder(f, f.name, ("image.nii.gz", "image.nii"), pattern, problems)
                for f in visible_folders(part)]
        found = [r for r in refs if r is not None]
        if not found:
            problems.append(f"{part}: no case folders with image.nii.gz and annotation_<r>.nii.gz "
                            f"({plural(len(refs), 'folder')} looked at)")
        return found

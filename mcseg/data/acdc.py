"""ACDC (Automated Cardiac Diagnosis Challenge, cine MRI) as published.

``<root>/training/patientXXX/`` (100 patients) and ``<root>/testing/patientXXX/`` (50), each
with ``Info.cfg`` (``ED``, ``ES``, ``Group``, ``Height``, ``NbFrame``, ``Weight``), the 4D
sequence ``patientXXX_4d.nii.gz`` and, for the end-diastolic and end-systolic frames,
``patientXXX_frameYY.nii.gz`` with ``patientXXX_frameYY_gt.nii.gz``. Labels: 0 background,
1 right ventricle, 2 myocardium, 3 left ventricle.

A case is one frame of one patient (``patient001_ED``). The split keeps both frames of a
patient together, uses the ``testing/`` patients as the test set (``official_split``) and
draws validation patients from ``training/`` stratified by the pathology group of
``Info.cfg`` (NOR, MINF, DCM, HCM, RV).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mcseg.data.base import SegmentationDataset, resolve_root
from mcseg.data.cases import CaseRef
from mcseg.data.files import find_volume
from mcseg.data.split import SplitInfo

CLASS_NAMES = ("background", "RV", "myocardium", "LV")
FRAMES = ("ED", "ES")


def read_info(path: Path) -> dict[str, str]:
    """``Info.cfg`` as a dict of strings (``key: value`` lines)."""
    info = {}
    for line in path.read_text().splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    return info


class ACDCDataset(SegmentationDataset):
    """The ACDC download (``database/`` folder, or the folder holding it).

    Args:
        root: the folder with ``training/`` and ``testing/`` (``.../ACDC/database``).
        frames: which annotated frames become cases (``ED``, ``ES`` or both).
        official_split: test on the ``testing/`` patients; validation patients come from
            ``training/``, stratified by pathology group. ``false`` draws all splits by
            patient from every patient found.
    """

    MODALITY = "MRI"

    def __init__(self, root: str, name: str = "acdc", frames: Sequence[str] = FRAMES,
                 official_split: bool = True, **kwargs) -> None:
        path = resolve_root(root)
        if not (path / "training").is_dir() and (path / "database" / "training").is_dir():
            path = path / "database"
        self.root = path
        self.frames = tuple(str(f).upper() for f in frames)
        if not self.frames or any(f not in FRAMES for f in self.frames) or len(set(self.frames)) != len(self.frames):
            raise ValueError(f"dataset.frames={list(frames)}: expected a non-empty list of ED and/or ES")
        self.official_split = bool(official_split)
        kwargs.setdefault("num_classes", len(CLASS_NAMES))
        if kwargs.get("class_names") is None:
            kwargs["class_names"] = list(CLASS_NAMES)
        super().__init__(name=name, **kwargs)
        self._finalise_classes()
        if not (self.root / "training").is_dir() and not (self.root / "testing").is_dir():
            raise FileNotFoundError(
                f"dataset.root={root}: no training/ or testing/ folder in {self.root} (give the ACDC 'database' folder)"
            )
        self._scanned: tuple[list[CaseRef], list[str]] | None = None
        self.patient_of: dict[str, str] = {}
        self.group_of: dict[str, str] = {}
        self.test_ids: list[str] = []

    def scan(self) -> tuple[list[CaseRef], list[str]]:
        if self._scanned is not None:
            return self._scanned
        refs, problems = [], []
        for part in ("training", "testing"):
            folder = self.root / part
            if not folder.is_dir():
                problems.append(f"{folder}: folder not found (the ACDC download has training/ and testing/)")
                continue
            part_refs = []
            for patient_dir in sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("patient")):
                found, problem = self._patient(patient_dir)
                part_refs += found
                if problem:
                    problems.append(problem)
            if part == "testing" and part_refs and not any(r.label_path.is_file() for r in part_refs):
                # the 2017 release shipped testing/ without _gt files: nothing to evaluate there
                self.note(f"{folder}: no _gt label files (the 2017 release); the testing patients are not used")
                continue
            refs += part_refs
            if part == "testing":
                self.test_ids = [r.case_id for r in part_refs]
        self._scanned = (sorted(refs, key=lambda r: r.case_id), problems)
        return self._scanned

    def _patient(self, folder: Path) -> tuple[list[CaseRef], str | None]:
        pid = folder.name
        info_path = folder / "Info.cfg"
        if not info_path.is_file():
            return [], f"{info_path}: file not found (it gives the ED and ES frame numbers)"
        try:
            info = read_info(info_path)
        except (OSError, UnicodeDecodeError) as exc:
            return [], f"{info_path}: cannot read ({exc})"
        refs = []
        for frame in self.frames:
            try:
                number = int(float(info[frame]))
            except (KeyError, ValueError):
                return [], f"{info_path}: no valid '{frame}:' frame number (found {info.get(frame)!r})"
            image = find_volume(folder, f"{pid}_frame{number:02d}")
            label = find_volume(folder, f"{pid}_frame{number:02d}_gt")
            case_id = f"{pid}_{frame}"
            refs.append(CaseRef(case_id, (image,), label))
            self.patient_of[case_id] = pid
            self.group_of[case_id] = info.get("Group", "unknown")
        return refs, None

    def split_info(self) -> SplitInfo:
        refs = self.case_refs()
        ids = {r.case_id for r in refs}
        test = [c for c in self.test_ids if c in ids] if self.official_split and self.test_ids else None
        return SplitInfo(
            test=test,
            groups={c: self.patient_of[c] for c in ids},
            strata={c: self.group_of[c] for c in ids},
        )

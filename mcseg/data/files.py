"""Finding a download's files: extensions, channel-suffixed image folders, expected paths.

Cases are listed with the files they *should* have, present or not, so a missing file is
reported by name when the case is read (or by ``mcseg-data check``), never silently skipped.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from mcseg.data.cases import CaseRef

VOLUME_EXTENSIONS = (".nii.gz", ".nii", ".mha", ".mhd", ".nrrd", ".nhdr")


def split_extension(name: str, extensions: Sequence[str] = VOLUME_EXTENSIONS) -> tuple[str, str] | None:
    """``("case_001", ".nii.gz")`` for ``case_001.nii.gz``; ``None`` for other files."""
    for ext in extensions:
        if name.endswith(ext) and len(name) > len(ext):
            return name[: -len(ext)], ext
    return None


def visible_files(folder: Path) -> list[Path]:
    """Regular files of ``folder`` without hidden ones (macOS ``._*`` resource forks included)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def visible_folders(folder: Path) -> list[Path]:
    """Sub-folders of ``folder`` without hidden ones, sorted."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def find_volume(folder: Path, stem: str, extensions: Sequence[str] = VOLUME_EXTENSIONS) -> Path:
    """The file ``stem + ext`` in ``folder`` for the first extension that exists, else the path
    with the first extension (so that the error names the file that was expected)."""
    for ext in extensions:
        path = folder / f"{stem}{ext}"
        if path.is_file():
            return path
    return folder / f"{stem}{extensions[0]}"


_CHANNEL = re.compile(r"^(?P<case>.+)_(?P<channel>\d{4})$")


def channel_cases(
    image_dir: Path, label_dir: Path | None, channels: int, file_ending: str = ".nii.gz"
) -> tuple[list[CaseRef], list[str]]:
    """Cases of an nnU-Net-style pair of folders: ``<case>_0000<ending>``... images, ``<case><ending>`` labels.

    Every case seen in either folder is listed with all the files it should have. Returns the
    refs and layout problems (a missing folder, a channel index beyond ``channels``).
    """
    problems: list[str] = []
    if not image_dir.is_dir():
        problems.append(f"{image_dir}: image folder not found")
    ids: set[str] = set()
    for path in visible_files(image_dir):
        if not path.name.endswith(file_ending):
            continue
        match = _CHANNEL.match(path.name[: -len(file_ending)])
        if match is None:
            problems.append(f"{path}: image file name lacks the _XXXX channel suffix (expected <case>_0000{file_ending})")
            continue
        if int(match["channel"]) >= channels:
            problems.append(f"{path}: channel {int(match['channel'])} but the dataset has {channels} channel(s)")
            continue
        ids.add(match["case"])
    if label_dir is not None:
        if not label_dir.is_dir():
            problems.append(f"{label_dir}: label folder not found")
        for path in visible_files(label_dir):
            if path.name.endswith(file_ending):
                ids.add(path.name[: -len(file_ending)])
    refs = [
        CaseRef(
            case_id,
            tuple(image_dir / f"{case_id}_{c:04d}{file_ending}" for c in range(channels)),
            label_dir / f"{case_id}{file_ending}" if label_dir is not None else None,
        )
        for case_id in sorted(ids)
    ]
    return refs, problems

"""The preprocessing cache: one folder per fingerprint of the settings, memory-mapped ``.npy`` files.

Layout: ``<cache_dir>/<dataset folder name>-<fingerprint>/`` holds ``settings.json`` (what
the fingerprint covers, for people) and per case ``<case>.json`` plus ``<case>.<array>.npy``.
The fingerprint is a hash of everything that determines the arrays (preprocessing steps,
normalisation, label mapping, dataset root and class); changing any of them re-caches into
a new folder, an unchanged one is reused. Each case's JSON also records the size and
modification time of its source files, so an edited file is preprocessed again.

Writes are lock-free: every file is written to a temporary name and renamed into place
(:func:`mcseg.files.atomic_write`), arrays first and the JSON last, so a case is visible
only once complete. Concurrent writers of the same case write identical content; the last
rename wins. The cache never lives under a dataset root (roots may be read-only).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mcseg.files import atomic_write

CACHE_VERSION = 1  # bump when preprocessing code changes what it writes


def default_cache_dir() -> Path:
    """``$MCSEG_CACHE_DIR``, else ``$XDG_CACHE_HOME/mcseg``, else ``~/.cache/mcseg``."""
    if os.environ.get("MCSEG_CACHE_DIR"):
        return Path(os.path.expanduser(os.environ["MCSEG_CACHE_DIR"]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mcseg"


def fingerprint(settings: Mapping) -> str:
    text = json.dumps({"version": CACHE_VERSION, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def source_stamp(paths: Sequence[Path | None]) -> list[list]:
    """``[path, size, mtime_ns]`` per existing source file; missing files are recorded as such."""
    stamps = []
    for path in paths:
        if path is None:
            continue
        try:
            st = os.stat(path)
            stamps.append([str(path), st.st_size, st.st_mtime_ns])
        except OSError:
            stamps.append([str(path), None, None])
    return stamps


class CaseCache:
    """Preprocessed cases of one dataset under one fingerprint."""

    def __init__(self, cache_dir: str | os.PathLike | None, settings: Mapping, label: str = "dataset") -> None:
        base = Path(os.path.expanduser(str(cache_dir))) if cache_dir else default_cache_dir()
        if not base.is_absolute():
            base = Path.cwd() / base
        self.settings = dict(settings)
        self.fingerprint = fingerprint(self.settings)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label) or "dataset"
        self.dir = base / f"{safe}-{self.fingerprint}"

    def _path(self, case_id: str, key: str) -> Path:
        return self.dir / f"{case_id}.{key}.npy"

    def get(self, case_id: str, sources: Sequence[Path | None]) -> tuple[dict[str, np.ndarray], dict] | None:
        """The cached arrays (memory-mapped, copy-on-write) and metadata, or ``None`` if absent or stale."""
        meta_path = self.dir / f"{case_id}.json"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if meta.get("fingerprint") != self.fingerprint or meta.get("sources") != source_stamp(sources):
            return None
        arrays = {}
        try:
            for key in meta.get("arrays", []):
                path = self._path(case_id, key)
                # mmap needs a non-empty file; tiny arrays (foreground points) are read outright
                small = path.stat().st_size < 4096
                arrays[key] = np.load(path, mmap_mode=None if small else "c", allow_pickle=False)
        except (OSError, ValueError):
            return None
        return arrays, meta

    def has(self, case_id: str, sources: Sequence[Path | None]) -> bool:
        meta_path = self.dir / f"{case_id}.json"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return meta.get("fingerprint") == self.fingerprint and meta.get("sources") == source_stamp(sources) and all(
            self._path(case_id, key).is_file() for key in meta.get("arrays", [])
        )

    def put(self, case_id: str, arrays: Mapping[str, np.ndarray], meta: Mapping, sources: Sequence[Path | None]) -> None:
        """Write arrays then the case's JSON (the commit marker), each atomically."""
        self.dir.mkdir(parents=True, exist_ok=True)
        settings_path = self.dir / "settings.json"
        if not settings_path.is_file():
            text = json.dumps({"version": CACHE_VERSION, **self.settings}, indent=1, sort_keys=True, default=str)
            atomic_write(settings_path, lambda tmp: tmp.write_text(text))
        for key, array in arrays.items():
            array = np.ascontiguousarray(array)

            def write(tmp: Path, array=array) -> None:
                with open(tmp, "wb") as f:
                    np.save(f, array, allow_pickle=False)

            atomic_write(self._path(case_id, key), write)
        record = {**meta, "case_id": case_id, "fingerprint": self.fingerprint, "arrays": sorted(arrays),
                  "sources": source_stamp(sources)}
        text = json.dumps(record, default=_jsonable)
        atomic_write(self.dir / f"{case_id}.json", lambda tmp: tmp.write_text(text))


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)

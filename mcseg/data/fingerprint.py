"""Cases identified by their content, not their names.

A case's fingerprint is a SHA-256 over the bytes of its source files in their roles (image channels in
order, then the label), without their names or paths: the same scan under another name or root has the
same fingerprint, another scan under the same name has another. Training records the fingerprint of
every case of its split in each checkpoint, and that of its images alone (:func:`image_fingerprint`); a resume on
data of other content is refused, and an evaluation says which scored cases are, by their images, cases the
checkpoint was trained or validated on (also when their labels differ: a single-rater copy of rater data).

Hashing reads every file once; the digests are cached by path, size and modification time under
``<cache dir>/content/`` (one JSON per dataset root), so later runs only ``stat`` the files, as the
preprocessing cache does (:func:`mcseg.data.cache.source_stamp`). Datasets without files (the built-in
phantoms) fingerprint what generates them (:meth:`SegmentationDataset.content_fingerprint`).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mcseg.data.cache import default_cache_dir
from mcseg.files import atomic_write

CHUNK = 1 << 20  # hash files in 1 MiB reads: a checkpoint never has to fit in memory twice
DIGITS = 32  # 128 bits of the SHA-256: ample against chance collisions, half the size in every checkpoint


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in ``CHUNK`` pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def combine(parts: Iterable[str]) -> str:
    """One fingerprint of several (ordered) parts."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:DIGITS]


class DigestCache:
    """File digests keyed by ``[size, mtime_ns]``, kept in one JSON file (written atomically; a concurrent
    writer's entries may be lost, which only costs a re-hash)."""

    def __init__(self, root: str | os.PathLike | None) -> None:
        key = hashlib.sha256(str(Path(root).resolve() if root else "none").encode()).hexdigest()[:16]
        self.path = default_cache_dir() / "content" / f"{key}.json"
        try:
            self.entries: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            self.entries = {}
        self.changed = False
        self.lock = threading.Lock()

    def digest(self, path: Path) -> str:
        st = os.stat(path)  # a missing file raises FileNotFoundError naming it
        stamp = [st.st_size, st.st_mtime_ns]
        key = str(Path(path).resolve())
        with self.lock:
            found = self.entries.get(key)
        if found is not None and found[:2] == stamp:
            return found[2]
        value = file_digest(path)
        with self.lock:
            self.entries[key] = [*stamp, value]
            self.changed = True
        return value

    def save(self) -> None:
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(self.entries)
            atomic_write(self.path, lambda tmp: tmp.write_text(text))
        except OSError:  # a read-only cache only costs time
            pass
        self.changed = False


def files_fingerprint(paths: Sequence[Path | None], cache: DigestCache, raters: Sequence[Path] = ()) -> str:
    """The fingerprint of one case's source files: roles and contents, not names. ``paths`` are the image
    channels then the label; ``raters`` the label maps of a case's raters, in order (a case with one label
    has none, and its fingerprint is what it was before raters existed)."""
    images, label = paths[:-1], paths[-1]
    parts = [f"image{i}:{cache.digest(p)}" for i, p in enumerate(images) if p is not None]
    parts.append(f"label:{cache.digest(label)}" if label is not None else "label:none")
    parts += [f"rater{r}:{cache.digest(p)}" for r, p in enumerate(raters)]
    return combine(parts)


def image_fingerprint(paths: Sequence[Path | None], cache: DigestCache) -> str:
    """The fingerprint of a case's images alone, the network's input: the same scan has the same one whatever its
    label or raters (a single-rater copy of a case with several raters), which is how an evaluation finds the
    cases a checkpoint saw in training (:func:`seen_in`)."""
    return combine(["inputs", *(f"image{i}:{cache.digest(p)}" for i, p in enumerate(paths) if p is not None)])


def case_fingerprints(dataset, refs: Sequence, workers: int | None = None, inputs: bool = False) -> dict[str, str]:
    """``{case_id: fingerprint}`` of ``refs`` (threads: hashing releases the GIL); ``inputs``: of the images
    alone (``dataset.input_fingerprint``), else of every source file (``dataset.content_fingerprint``)."""
    from mcseg.runtime import available_cpus

    cache = DigestCache(getattr(dataset, "root", None))
    fingerprint = dataset.input_fingerprint if inputs else dataset.content_fingerprint
    workers = workers or min(8, available_cpus())
    if workers <= 1 or len(refs) <= 1:
        values = [fingerprint(r, cache) for r in refs]
    else:
        with ThreadPoolExecutor(workers) as pool:
            values = list(pool.map(lambda r: fingerprint(r, cache), refs))
    cache.save()
    return {r.case_id: v for r, v in zip(refs, values)}


def split_fingerprints(dataset, refs_by_split: Mapping[str, Sequence], inputs: bool = False) -> dict[str, dict[str, str]]:
    """``{split: {case_id: fingerprint}}``: each case hashed once, also when in several lists (``inputs``: of
    the images alone, :func:`case_fingerprints`)."""
    unique = {r.case_id: r for refs in refs_by_split.values() for r in refs}
    prints = case_fingerprints(dataset, list(unique.values()), inputs=inputs)
    return {name: {r.case_id: prints[r.case_id] for r in refs} for name, refs in refs_by_split.items()}


def split_content_sha256(content: Mapping[str, Mapping[str, str]]) -> str:
    """One fingerprint of a whole split: which content is in which part (train, val, test), names aside."""
    return combine(f"{name}:{fp}" for name in sorted(content) for fp in sorted(content[name].values()))


def content_differences(recorded: Mapping[str, Mapping[str, str]], now: Mapping[str, Mapping[str, str]]) -> list[str]:
    """``"<case> (<split>)"`` for every case whose content (or presence) differs between two records."""
    found = []
    for name in sorted(recorded):
        for case, fp in recorded[name].items():
            if now.get(name, {}).get(case) != fp:
                found.append(f"{case} ({name})")
    return found


def seen_in(recorded: Mapping[str, Mapping[str, str]], scored: Mapping[str, str],
            parts: tuple[str, ...] = ("train", "val")) -> dict[str, dict[str, str]]:
    """Per part of a checkpoint's split: ``{scored case: the recorded case with the same content}``."""
    out = {}
    for name in parts:
        by_content = {fp: case for case, fp in (recorded.get(name) or {}).items()}
        hits = {case: by_content[fp] for case, fp in scored.items() if fp in by_content}
        if hits:
            out[name] = hits
    return out

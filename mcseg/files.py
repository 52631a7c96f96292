"""Writing result files: atomically (readers never see a partial file), as JSON or as CSV; and undoing what a
block wrote into a folder when it fails (:func:`undone_on_failure`).

Every file mcseg writes goes through :func:`atomic_write`: the content goes to a temporary file beside the
target (``.<stem>.<random><suffix>``, which :func:`mcseg.rundir.remove_orphans` cleans up after a kill) and is
renamed onto it. A full disk is one :class:`~mcseg.errors.DiskFullError` naming the file meant.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from mcseg.errors import as_disk_full

_UMASK = os.umask(0)
os.umask(_UMASK)


def check_writable(out: Path, option: str = "--out") -> None:
    """Check that the output folder ``out`` (or, where it does not exist yet, its nearest existing parent) is a
    folder a file can be written in (a probe file, removed), before anything is computed or written: an OSError
    naming it and ``option`` otherwise. Nothing is created."""
    existing = Path(out).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"{existing} is not a folder")
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".mcseg-write-test-"):
            pass
    except OSError as exc:
        raise OSError(f"{option} {out}: the output folder cannot be written ({exc.strerror or exc}); pass "
                      f"{option} a writable folder") from None


def atomic_write(path: Path, write_fn) -> None:
    """Call ``write_fn(tmp_path)`` then rename onto ``path`` so readers never see a partial file.

    A full disk is a :class:`~mcseg.errors.DiskFullError` naming ``path`` and the space left."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        suffix = "".join(path.suffixes)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=suffix)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files: results must stay readable like any other file
        write_fn(Path(tmp))
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        full = as_disk_full(exc, path)  # a full disk names the file meant, not the temporary one, and the free space
        if full is None or full is exc:
            raise
        raise full from exc


def torch_save(obj, path: Path) -> None:
    """``torch.save`` through a Python file: a full disk is then an OSError (ENOSPC) that :func:`atomic_write`
    names in one line, where torch's own C++ writer given a path raises a RuntimeError that says nothing
    of space ("unexpected pos 23040 vs 22960")."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)


def json_text(payload) -> str:
    """``payload`` as indented JSON text ending in a newline (what :func:`write_json` writes)."""
    return json.dumps(payload, indent=2, default=str) + "\n"


def write_json(path: Path, payload) -> None:
    """Write ``payload`` as indented JSON through :func:`atomic_write`."""
    text = json_text(payload)
    atomic_write(Path(path), lambda tmp: tmp.write_text(text))


def write_csv(path: Path, rows: Iterable[dict], columns: Sequence[str] | None = None,
              lineterminator: str = "\r\n") -> None:
    """Rows of dicts as CSV with a header of ``columns`` (default: the first row's keys), written through
    :func:`atomic_write`.

    The csv module formats the cells (``None`` and a missing key as an empty cell, floats as their repr); a
    key not in ``columns`` is an error. ``lineterminator``: the csv module's default, or ``"\\n"``."""
    rows = list(rows)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0] if columns is None else columns),
                            lineterminator=lineterminator)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(Path(path), lambda tmp: tmp.write_text(buffer.getvalue()))


@contextmanager
def undone_on_failure(folder: Path) -> Iterator[None]:
    """Run a block that writes into ``folder``; when it raises (an error, Ctrl-C), remove every file and folder it
    created there, and ``folder`` and its parents where the block created them and they are left empty: a failed
    command leaves nothing that refuses its corrected rerun (an evaluation's summary.json without its conformal
    pass). What was there before is left as it is."""
    folder = Path(folder)
    created = [folder, *folder.parents]
    created = created[:next(i for i, d in enumerate(created) if d.exists())]  # the folders the block may make
    before = set(folder.rglob("*")) if folder.exists() else set()
    try:
        yield
    except BaseException:
        if folder.exists():
            for path in sorted(set(folder.rglob("*")) - before, key=lambda p: len(p.parts), reverse=True):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        for directory in created:
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        raise

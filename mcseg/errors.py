"""Errors that end a run with a message for the user rather than a traceback."""
from __future__ import annotations

import errno
import os
import shutil
import signal
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk, an exceeded quota


class ConfigError(ValueError):
    """A config key is unknown, missing or of the wrong type; the message names the key."""


class NonFiniteLossError(FloatingPointError):
    """A loss or gradient became NaN/inf; the message names the epoch, step and cases."""


class TrainingInterrupted(RuntimeError):
    """The run was asked to stop (SIGTERM or SIGINT: ``signum``) and wrote its checkpoint first."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = int(signum)


class DiskFullError(OSError):
    """A write failed for want of space (a full disk or a quota); the message names the file and the free space."""

    def __init__(self, path: str | os.PathLike, code: int = errno.ENOSPC) -> None:
        super().__init__(code, os.strerror(code), os.fspath(path))
        what = "disk quota exceeded" if code == errno.EDQUOT else "no space left on device"
        where = f"into {path}" if Path(path).is_dir() else str(path)
        self.message = f"{what} writing {where} ({free_space(Path(path))} free on its file system)"

    def __str__(self) -> str:
        return self.message


def free_space(path: Path) -> str:
    """The free space of the file system holding ``path`` (or its nearest existing parent), e.g. ``1.2 GiB``."""
    for place in (path, *path.parents):
        if place.exists():
            try:
                free = float(shutil.disk_usage(place).free)
            except OSError:
                break
            for unit in ("B", "KiB", "MiB", "GiB"):
                if free < 1024:
                    return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
                free /= 1024
            return f"{free:.1f} TiB"
    return "unknown"


def as_disk_full(exc: BaseException, path: str | os.PathLike | None = None) -> DiskFullError | None:
    """``exc`` as a :class:`DiskFullError` when it, or an error it was raised from or while handling, is a full
    disk (ENOSPC, EDQUOT): torch's writers, for one, raise a RuntimeError while the OSError is their context.
    The file named is ``path``, else the OSError's own; None when no full disk is involved."""
    seen, todo = set(), [exc]
    while todo:
        error = todo.pop(0)
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, DiskFullError):
            return error
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            target = path if path is not None else error.filename
            return DiskFullError(target, error.errno) if target is not None else None
        todo += [error.__cause__, error.__context__]
    return None

"""Registries that refuse what they cannot hold: one entry per name (GUIDE, "Registries").

Every list of extension points (conformal losses, post-hoc scalers, prediction formats, the table of figures, the
new-case statements) is built or checked by :func:`unique`: a second entry under a name already taken is refused
with one line naming both, instead of one silently replacing the other (a format whose name collides would take
another's files; a loss under a taken name would be computed as the other).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["DuplicateName", "describe", "unique"]

T = TypeVar("T")


class DuplicateName(ValueError):
    """Two entries of a registry under one name."""


def describe(entry: object) -> str:
    """A class as ``module.Name``; anything else as its repr (shortened)."""
    if isinstance(entry, type):
        return f"{entry.__module__}.{entry.__qualname__}"
    text = repr(entry)
    return text if len(text) <= 80 else text[:77] + "..."


def unique(entries: Iterable[T], name: Callable[[T], str], what: str) -> dict[str, T]:
    """``{name(entry): entry}`` in order; a name given twice raises :class:`DuplicateName` naming both entries."""
    out: dict[str, T] = {}
    for entry in entries:
        key = name(entry)
        if key in out:
            raise DuplicateName(f"{what} {key!r} is declared twice: by {describe(out[key])} and by "
                                f"{describe(entry)}; give each its own name")
        out[key] = entry
    return out

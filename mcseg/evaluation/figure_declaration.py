"""One reported figure: its keys, how a person reads it and where it shows (the record of the table of figures,
:mod:`mcseg.evaluation.figure_table`, whose docstring says what each field means)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Figure", "SHOWS", "shows"]

#: the places a figure can show (mcseg.evaluation.figure_table' docstring)
SHOWS = frozenset({"headline", "hparams", "posthoc", "shift", "report", "predictor"})


def shows(*places: str) -> frozenset[str]:
    return frozenset(places)


@dataclass(frozen=True)
class Figure:
    """One reported figure."""

    key: str
    label: str
    per: Literal["class", "case", "split"]
    kind: Literal["segmentation", "calibration", "failure"]
    better: int  # +1 higher is better, -1 lower is better, 0 closer to zero is better
    shows: frozenset[str] = frozenset()
    digits: int = 3
    pooled: bool = False  # a per-case figure also computed over every voxel of the split (summary "pooled")
    path: tuple[str, ...] = ()  # where a split-level figure sits in summary.json

    def __post_init__(self) -> None:
        if self.shows - SHOWS:
            raise ValueError(f"figure {self.key!r}: unknown places {sorted(self.shows - SHOWS)} (expected {sorted(SHOWS)})")
        if self.per not in ("class", "case", "split"):
            raise ValueError(f"figure {self.key!r}: per={self.per!r}, expected class, case or split")
        if (self.per == "split") != bool(self.path):
            raise ValueError(f"figure {self.key!r}: a split-level figure needs its summary path, and only it")
        if self.better not in (-1, 0, 1):
            raise ValueError(f"figure {self.key!r}: better={self.better}, expected -1, 0 or +1")

    @property
    def summary_key(self) -> str:
        """Its split value: ``mean_foreground_<key>`` or ``mean_<key>``; a split-level figure: its path joined."""
        if self.per == "class":
            return f"mean_foreground_{self.key}"
        return f"mean_{self.key}" if self.per == "case" else "/".join(self.path)

    @property
    def summary_path(self) -> tuple[str, ...]:
        return self.path or (self.summary_key,)

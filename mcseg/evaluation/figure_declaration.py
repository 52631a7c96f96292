"""One reported figure: its keys, how a person reads it and where it shows (the record of the table of figures,
:mod:`mcseg.evaluation.figure_table`, whose docstring says what each field means)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from mcseg.config import EvalProtocol

__all__ = ["Figure", "SHOWS", "KINDS", "shows"]

#: the kinds of figures, in the order their protocol texts are listed in summary.json's ``protocol``
KINDS = ("calibration", "segmentation", "failure")

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
    # whether mcseg-report tests it where it shows ("report"): a 95% bootstrap interval over the cases' values and
    # a paired Wilcoxon test against the baseline; a split-level figure has no per-case values and is never tested
    tested: bool = True
    # its definition as summary.json's ``protocol`` states it: a text, or one made from the protocol's settings and
    # whether the task is multi-label; None: nothing stated (e.g. Dice, defined by the empty policy)
    protocol: str | Callable[["EvalProtocol", bool], str] | None = None
    protocol_key: str = ""  # the key of that text in ``protocol`` (default: the figure's key)

    def __post_init__(self) -> None:
        if self.shows - SHOWS:
            raise ValueError(f"figure {self.key!r}: unknown places {sorted(self.shows - SHOWS)} (expected {sorted(SHOWS)})")
        if self.per not in ("class", "case", "split"):
            raise ValueError(f"figure {self.key!r}: per={self.per!r}, expected class, case or split")
        if (self.per == "split") != bool(self.path):
            raise ValueError(f"figure {self.key!r}: a split-level figure needs its summary path, and only it")
        if self.better not in (-1, 0, 1):
            raise ValueError(f"figure {self.key!r}: better={self.better}, expected -1, 0 or +1")
        if self.kind not in KINDS:
            raise ValueError(f"figure {self.key!r}: kind={self.kind!r}, expected one of {', '.join(KINDS)}")
        if self.per == "split" and self.tested:
            object.__setattr__(self, "tested", False)  # no per-case values to resample or pair

    @property
    def directional(self) -> bool:
        """Whether one direction is better (``better`` +1 or -1): only such a figure has robustness scores under
        shift; one whose best value is zero (``better`` 0) has not."""
        return self.better != 0

    def protocol_text(self, protocol: "EvalProtocol", multilabel: bool) -> str | None:
        """Its definition for summary.json's ``protocol`` (``protocol``), under ``protocol_key or key``."""
        return self.protocol(protocol, multilabel) if callable(self.protocol) else self.protocol

    @property
    def summary_key(self) -> str:
        """Its split value: ``mean_foreground_<key>`` or ``mean_<key>``; a split-level figure: its path joined."""
        if self.per == "class":
            return f"mean_foreground_{self.key}"
        return f"mean_{self.key}" if self.per == "case" else "/".join(self.path)

    @property
    def summary_path(self) -> tuple[str, ...]:
        return self.path or (self.summary_key,)

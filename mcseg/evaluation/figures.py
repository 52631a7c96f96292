"""The table of figures: every figure an evaluation reports, declared once.

A :class:`Figure` names its per-case key (the column of per_case.csv), where its split value sits in
summary.json, how a person reads it (label, digits, which direction is better) and where it shows. Every list
of figures elsewhere (the evaluator's columns, the post-hoc block, the shift tables, the report's columns, the
console headline, TensorBoard's HParams) is a selection of :data:`FIGURES`, so a new figure is one entry here
plus the code that computes it (tests/test_figures.py checks that the evaluator writes exactly the declared
columns).

Per-case figures come in two kinds:

* ``per="class"``: one value per foreground class (or region) of a case: a row of per_case.csv per class;
  in summary.json ``mean_foreground_<key>`` (the mean over cases of each case's mean over foreground classes)
  and ``foreground.<key>`` (its statistics), and ``per_class.<name>.<key>``.
* ``per="case"``: one value per case (the calibration figures over the case's voxel region): a column of
  per_case.csv repeated on the case's rows; in summary.json ``mean_<key>``, ``calibration.<key>`` and, pooled
  over every voxel of the split, ``pooled.<key>``.

Split-level figures (failure detection over the cases) have no per-case column: ``path`` locates them in
summary.json.

Where a figure shows (``shows``):

* ``headline``: printed after training and evaluation, logged as ``val/<key>`` during training, returned by
  ``train()`` as ``test/<key>`` (a sweep's objective and ``score.<key>`` choose among these);
* ``hparams``: TensorBoard's HParams view of a sweep's runs;
* ``posthoc``: copied from each post-hoc scaler's summary into ``posthoc.<scaler>`` of the main summary;
* ``shift``: a table per figure of the evaluation under shift (shift_summary.json, mcseg-report's "Under shift");
* ``report``: a column of mcseg-report's comparison table (raw outputs; calibration figures also after the
  temperature: ``<key>_post_T``), with per-case bootstrap intervals and Wilcoxon tests;
* ``predictor``: a column of mcseg-report's table of predictors (single network, + T, ensembles, TTA, ...).

Every evaluation's numeric summary values also go to the trackers (``summary_metrics``), whatever ``shows``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Figure", "FIGURES", "SHOWS", "figure", "shown_in", "class_keys", "case_keys", "summary_value"]

SHOWS = frozenset({"headline", "hparams", "posthoc", "shift", "report", "predictor"})


@dataclass(frozen=True)
class Figure:
    """One reported figure (module docstring)."""

    key: str
    label: str
    per: Literal["class", "case", "split"]
    kind: Literal["segmentation", "calibration", "failure"]
    better: int  # +1 higher is better, -1 lower is better, 0 closer to zero is better
    shows: frozenset[str] = frozenset()
    digits: int = 3
    pooled: bool = False  # a per-case calibration figure also computed over every voxel of the split
    path: tuple[str, ...] = ()  # where a split-level figure sits in summary.json

    def __post_init__(self) -> None:
        if self.shows - SHOWS:
            raise ValueError(f"figure {self.key!r}: unknown places {sorted(self.shows - SHOWS)} (expected {sorted(SHOWS)})")
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


def _shows(*places: str) -> frozenset[str]:
    return frozenset(places)


_FD = ("failure_detection", "predictive_entropy")
_EVERYWHERE = _shows("headline", "hparams", "posthoc", "shift", "report", "predictor")

FIGURES: tuple[Figure, ...] = (
    Figure("dice", "Dice", "class", "segmentation", +1, _EVERYWHERE),
    Figure("hd95_mm", "HD95 (mm)", "class", "segmentation", -1, _EVERYWHERE, digits=2),
    Figure("assd_mm", "ASSD (mm)", "class", "segmentation", -1),
    Figure("ece", "ECE", "case", "calibration", -1, _EVERYWHERE, pooled=True),
    Figure("mce", "MCE", "case", "calibration", -1, pooled=True),
    Figure("classwise_ece", "CECE", "case", "calibration", -1, _EVERYWHERE, pooled=True),
    Figure("adaptive_ece", "AdaECE", "case", "calibration", -1, pooled=True),
    Figure("smooth_ece", "smECE", "case", "calibration", -1, _shows("posthoc", "shift", "report", "predictor"),
           pooled=True),
    Figure("signed_ece", "signed ECE", "case", "calibration", 0, _shows("posthoc", "shift", "predictor"),
           pooled=True),
    Figure("nll", "NLL", "case", "calibration", -1, _shows("posthoc", "shift", "predictor"), pooled=True),
    Figure("brier", "Brier", "case", "calibration", -1, _shows("posthoc", "predictor"), pooled=True),
    Figure("voxel_auroc", "AUROC (per case)", "split", "failure", +1, _shows("shift"), path=(*_FD, "voxel_auroc")),
    Figure("aurc", "AURC", "split", "failure", -1, _shows("shift", "predictor"), path=(*_FD, "image", "aurc")),
    Figure("eaurc", "E-AURC", "split", "failure", -1, _shows("predictor"), path=(*_FD, "image", "eaurc")),
    Figure("aurc_achievable", "achievable AURC", "split", "failure", -1, _shows("predictor"),
           path=(*_FD, "image", "aurc_achievable")),
    Figure("eaugrc", "E-AUGRC", "split", "failure", -1, _shows("predictor"), path=(*_FD, "image", "eaugrc")),
    Figure("ueo", "UEO", "split", "failure", +1, _shows("predictor"), path=(*_FD, "ueo")),
    Figure("auroc", "AUROC", "split", "failure", +1, _shows("predictor"), path=(*_FD, "voxel_auroc_pooled")),
)


def figure(key: str) -> Figure:
    """The entry of ``key``."""
    for f in FIGURES:
        if f.key == key:
            return f
    raise KeyError(f"no figure {key!r} in the table of figures (mcseg/evaluation/figures.py)")


def shown_in(place: str) -> tuple[Figure, ...]:
    """The figures that show in ``place`` (one of :data:`SHOWS`), in table order."""
    if place not in SHOWS:
        raise ValueError(f"place {place!r}: expected one of {sorted(SHOWS)}")
    return tuple(f for f in FIGURES if place in f.shows)


def class_keys() -> tuple[str, ...]:
    """The per-class figures of a case (the rows of per_case.csv)."""
    return tuple(f.key for f in FIGURES if f.per == "class")


def case_keys() -> tuple[str, ...]:
    """The per-case calibration figures (columns repeated on a case's rows; also pooled)."""
    return tuple(f.key for f in FIGURES if f.per == "case")


def summary_value(summary: dict, fig: Figure):
    """The figure's split value in a summary (None where the evaluation did not measure it)."""
    value = summary
    for part in fig.summary_path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value

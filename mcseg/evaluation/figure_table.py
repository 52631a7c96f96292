"""The table of figures: every figure an evaluation reports, declared once.

A :class:`~mcseg.evaluation.figure_declaration.Figure` names its per-case key (the column of per_case.csv), where its split value sits in
summary.json, how a person reads it (label, digits, which direction is better) and where it shows. Every list
of figures elsewhere (the evaluator's columns, the post-hoc block, the shift tables, the report's columns, the
console headline, TensorBoard's HParams) is a selection of :func:`table`. Per-case figures are declared by the
scorer that computes them (:mod:`mcseg.evaluation.scorers`), listed once in :data:`SCORERS`; split-level ones in
:data:`SPLIT_FIGURES`. A new per-case figure is therefore one scorer class and one entry of ``SCORERS`` (a scorer for some
kinds of task only, e.g. binary or region tasks, says so in ``Scorer.applies``, one against several raters
sets ``Scorer.needs_raters``: :func:`active_scorers`); every
selection is read at use time, so an entry added later (a plug-in, a test) shows everywhere
(tests/test_figures.py checks that the evaluator writes exactly the declared figures).

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

from mcseg.evaluation.figure_declaration import SHOWS, Figure, shows
from mcseg.registry import unique
from mcseg.evaluation.challenge_scorers import CurvasRatersScorer, QuBratsScorer, ShiftsLesionScorer
from mcseg.evaluation.scorers import CalibrationScorer, OverlapScorer, PECEScorer, Scorer, SurfaceScorer

__all__ = ["SCORERS", "SPLIT_FIGURES", "active_scorers", "table", "figure", "shown_in", "summary_keys", "class_keys", "case_keys",
           "summary_value"]

#: the per-case scorers, in the order of their columns
SCORERS: list[type[Scorer]] = [OverlapScorer, SurfaceScorer, CalibrationScorer, PECEScorer, ShiftsLesionScorer,
                               QuBratsScorer, CurvasRatersScorer]

_FD = ("failure_detection", "predictive_entropy")

#: split-level figures: failure detection of the predictive entropy over the cases (mcseg.metrics.failure)
SPLIT_FIGURES: tuple[Figure, ...] = (
    Figure("voxel_auroc", "AUROC (per case)", "split", "failure", +1, shows("shift"), path=(*_FD, "voxel_auroc")),
    Figure("aurc", "AURC", "split", "failure", -1, shows("shift", "predictor"), path=(*_FD, "image", "aurc")),
    Figure("eaurc", "E-AURC", "split", "failure", -1, shows("predictor"), path=(*_FD, "image", "eaurc")),
    Figure("aurc_achievable", "achievable AURC", "split", "failure", -1, shows("predictor"),
           path=(*_FD, "image", "aurc_achievable")),
    Figure("eaugrc", "E-AUGRC", "split", "failure", -1, shows("predictor"), path=(*_FD, "image", "eaugrc")),
    Figure("ueo", "UEO", "split", "failure", +1, shows("predictor"), path=(*_FD, "ueo")),
    # conformal sets of the raw probabilities (evaluate.py conformal.enabled=true; docs/conformal.md), means over
    # the classes of the test split: the loss is held at or below alpha by construction, the volume is its price
    Figure("conformal_loss", "conformal test loss", "split", "calibration", -1, shows("predictor"),
           path=("conformal", "raw", "mean_test_loss")),
    Figure("conformal_volume", "conformal set / prediction", "split", "calibration", -1, shows("predictor"),
           path=("conformal", "raw", "mean_set_over_prediction")),
    Figure("auroc", "AUROC", "split", "failure", +1, shows("predictor"), path=(*_FD, "voxel_auroc_pooled")),
)


def active_scorers(num_classes: int, multilabel: bool, raters: bool = False) -> list[type[Scorer]]:
    """The entries of ``SCORERS`` that score a task of this kind (:meth:`Scorer.applies`), in order, those that
    score against several raters (``needs_raters``) only when ``raters``: an evaluation writes their figures and
    only theirs."""
    return [scorer for scorer in SCORERS
            if scorer.applies(num_classes, multilabel) and (raters or not scorer.needs_raters)]


def table() -> tuple[Figure, ...]:
    """Every figure: the scorers' (in ``SCORERS`` order), then the split-level ones. Keys are unique."""
    figures = (*(f for scorer in SCORERS for f in scorer.figures), *SPLIT_FIGURES)
    unique(SCORERS, lambda scorer: scorer.__name__, "scorer")
    unique(figures, lambda f: f.key, "the table of figures' key")
    return figures


def figure(key: str) -> Figure:
    """The entry of ``key``."""
    for f in table():
        if f.key == key:
            return f
    raise KeyError(f"no figure {key!r} in the table of figures (mcseg/evaluation/figure_table.py)")


def shown_in(place: str) -> tuple[Figure, ...]:
    """The figures that show in ``place`` (one of :data:`~mcseg.evaluation.figure_declaration.SHOWS`), in table order."""
    if place not in SHOWS:
        raise ValueError(f"place {place!r}: expected one of {sorted(SHOWS)}")
    return tuple(f for f in table() if place in f.shows)


def summary_keys(place: str) -> tuple[str, ...]:
    """The summary keys of the figures that show in ``place`` (e.g. the console headline)."""
    return tuple(f.summary_key for f in shown_in(place))


def class_keys() -> tuple[str, ...]:
    """The per-class figures of a case (a row of per_case.csv per class)."""
    return tuple(f.key for f in table() if f.per == "class")


def case_keys() -> tuple[str, ...]:
    """The per-case figures (columns repeated on a case's rows)."""
    return tuple(f.key for f in table() if f.per == "case")


def summary_value(summary: dict, fig: Figure):
    """The figure's split value in a summary (None where the evaluation did not measure it)."""
    value = summary
    for part in fig.summary_path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value

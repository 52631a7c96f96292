"""Per-case scorers: thin faces over :mod:`mcseg.metrics` that turn one case into its figures.

A scorer declares the figures it computes (:class:`~mcseg.evaluation.figure_declaration.Figure` entries of the table of
figures) and returns them from :meth:`Scorer.score`: a list of K values for a ``per="class"`` figure (one per
class or region; the background entry is ignored), a number for a ``per="case"`` one. It may also return extra
per-class columns (``class_extras``, e.g. the structure status) and per-case columns (``case_extras``). The
:class:`~mcseg.evaluation.evaluator.Evaluator` calls every scorer of :data:`mcseg.evaluation.figure_table.SCORERS` on
each case, then :meth:`Scorer.commit` on all of them once the case is fully evaluated (a case that fails in one
scorer leaves no trace in any), and asks each for its pooled values (``pooled=True`` figures) at the end.

A new per-case figure is a new scorer class plus its entry in ``SCORERS`` (see README, "Extending mcseg"); a
scorer meant for some tasks only says so in :meth:`Scorer.applies`, one that scores against several raters
(:attr:`CaseView.raters`) sets ``needs_raters``.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from mcseg.config import EvalProtocol
from mcseg.evaluation.figure_declaration import Figure, shows
from mcseg.metrics.binning import BinSums
from mcseg.metrics.calibration import NLL_FLOOR, CalibrationStats, case_calibration
from mcseg.metrics.overlap import dice_score, overlap_counts
from mcseg.metrics.pece import PECE_BINS, PECE_DESCRIPTION, PECE_FP_WEIGHT, pece
from mcseg.metrics.regions import region_mask
from mcseg.metrics.reliability import case_histogram
from mcseg.metrics.statistics import nanmean
from mcseg.metrics.surface import surface_distances

__all__ = ["CaseView", "Scorer", "OverlapScorer", "SurfaceScorer", "CalibrationScorer", "PECEScorer", "EVERYWHERE"]

EVERYWHERE = shows("headline", "hparams", "posthoc", "shift", "report", "predictor")


@dataclass(frozen=True)
class CaseView:
    """What a scorer sees of one case (checked by the evaluator): probabilities ``C x *spatial`` (float32, or
    None for a label map alone), the label and the prediction (``*spatial`` integers, or ``R x *spatial`` binary
    stacks when multilabel), the spacing in mm, the top-label confidence and class (softmax tasks), and the
    case's raters' label maps ``K x *spatial`` (integers on the label's device; None for a case with one label)."""

    case_id: str
    probs: torch.Tensor | None
    label: torch.Tensor
    prediction: torch.Tensor
    spacing: tuple[float, ...]
    top: tuple[torch.Tensor, torch.Tensor] | None
    raters: torch.Tensor | None = None
    regions: dict = field(default_factory=dict, compare=False)  # (region, width in mm) -> its mask, once computed

    def region(self, region: str, width_mm: float) -> torch.Tensor | None:
        """The voxel region of this case (:func:`~mcseg.metrics.regions.region_mask`, softmax maps), computed once:
        the boundary band takes a distance transform, and failure detection asks for it again."""
        key = (region, float(width_mm))
        if key not in self.regions:
            self.regions[key] = region_mask(region, self.label, self.prediction, self.spacing, width_mm)
        return self.regions[key]


class Scorer:
    """Base of the per-case scorers (module docstring)."""

    figures: tuple[Figure, ...] = ()
    class_extras: tuple[str, ...] = ()  # per-class columns besides the figures (per_case.csv rows)
    case_extras: tuple[str, ...] = ()  # per-case columns besides the figures
    needs_raters: bool = False  # built only by an evaluator of cases with several raters (Evaluator(raters=True))

    def __init__(self, num_classes: int, class_names: Sequence[str], protocol: EvalProtocol,
                 multilabel: bool = False) -> None:
        self.num_classes, self.class_names, self.protocol, self.multilabel = (
            num_classes, list(class_names), protocol, multilabel)

    @classmethod
    def applies(cls, num_classes: int, multilabel: bool) -> bool:
        """Whether this scorer scores a task of this kind (default: every task). An evaluator of another kind
        of task neither builds it nor writes its figures (e.g. the binary-task and region-task challenge figures,
        :mod:`mcseg.evaluation.challenge_scorers`)."""
        return True

    def score(self, case: CaseView) -> dict:
        raise NotImplementedError

    def commit(self) -> None:
        """The case last scored was evaluated by every scorer: keep what pools over cases."""

    def merge(self, other: Scorer) -> None:
        """Add what ``other`` (the same scorer of another evaluator, e.g. a worker's) pooled over its committed
        cases, as if they were committed here after the others (nothing for a scorer that pools nothing)."""

    def pooled(self) -> dict:
        """Values of the ``pooled`` figures over every voxel of the committed cases."""
        return {}


class OverlapScorer(Scorer):
    """Dice per class (:mod:`mcseg.metrics.overlap`) and the structure status of the empty-structure policy."""

    figures = (Figure("dice", "Dice", "class", "segmentation", +1, EVERYWHERE),)
    class_extras = ("status",)

    def score(self, case: CaseView) -> dict:
        counts = overlap_counts(case.prediction, case.label, self.num_classes, self.multilabel)
        self._empty_label = (case.case_id, int(counts.n_label.sum() if self.multilabel else counts.n_label[1:].sum()) == 0)
        return {"dice": dice_score(counts).tolist(), "status": [s.value for s in counts.status()]}

    def commit(self) -> None:
        case_id, empty = self._empty_label
        if empty:
            warnings.warn(f"case {case_id}: the label has no foreground voxel", stacklevel=4)


class SurfaceScorer(Scorer):
    """HD (the protocol's percentile and definition) and ASSD per class, in mm (:mod:`mcseg.metrics.surface`)."""

    figures = (Figure("hd95_mm", "HD95 (mm)", "class", "segmentation", -1, EVERYWHERE, digits=2,
                      protocol=lambda p, multilabel: HD_DEFINITIONS[p.hd_definition].format(p.hd_percentile)
                      + ", in mm with the voxel spacing", protocol_key="hd"),
               Figure("assd_mm", "ASSD (mm)", "class", "segmentation", -1,
                      protocol="mean of both directed surface distance sets pooled, in mm", protocol_key="assd"))

    def score(self, case: CaseView) -> dict:
        dist = surface_distances(case.prediction, case.label, self.num_classes, case.spacing,
                                 self.protocol.hd_percentile, self.protocol.hd_definition, self.multilabel)
        return {"hd95_mm": dist.hd.tolist(), "assd_mm": dist.assd.tolist()}


#: the HD of ``evaluation.hd_definition``, as summary.json's protocol states it (the percentile formatted in)
HD_DEFINITIONS = {
    "max_directed": "max of the two directed {:g}th percentiles of surface distances (MONAI, DeepMind surface-distance)",
    "pooled": "{:g}th percentile of both directed surface distance sets pooled (medpy)",
}


def _accumulate(pooled: CalibrationStats, case: CalibrationStats) -> CalibrationStats:
    """``pooled + case``, added into ``pooled`` (an accumulator started by ``copy``: :meth:`CalibrationStats.__iadd__`)."""
    pooled += case
    return pooled


def _per_region(text: str, multilabel_text: str = "; multilabel: mean over regions"):
    """A protocol text that adds how a multi-label task averages its regions."""
    return lambda protocol, multilabel: text + (multilabel_text if multilabel else "")


def _calibration_figure(key: str, label: str, places: frozenset[str] = frozenset(), better: int = -1,
                        protocol=None) -> Figure:
    return Figure(key, label, "case", "calibration", better, places, pooled=True, protocol=protocol)


class CalibrationScorer(Scorer):
    """The calibration figures of a case over the protocol's voxel region, from one pass of bin sums
    (:mod:`mcseg.metrics.calibration`); pooled over every voxel of the split from the summed statistics, and the
    dataset reliability histogram. Multilabel tasks: each region as a two-class problem (1 - p_r, p_r) on its own
    voxels, the case's value the mean over regions (docs/protocol.md)."""

    figures = (
        _calibration_figure("ece", "ECE", EVERYWHERE, protocol=_per_region(
            "top-label ECE, sum_b |B_b|/N |acc - conf| (Guo et al. 2017)",
            "; multilabel: mean over regions of the binary top-label ECE")),
        _calibration_figure("mce", "MCE"),
        _calibration_figure("classwise_ece", "CECE", EVERYWHERE, protocol=lambda p, multilabel: (
            "mean over regions of the binary ECE of p_r against y_r" if multilabel else
            "(1/K) sum_k ECE of p_k against 1[y=k] over all K classes incl. background "
            "(Kumar et al. 2019, Nixon et al. 2019)")),
        _calibration_figure("adaptive_ece", "AdaECE", protocol=(
            "AdaECE (Mukhoti et al. 2020): top-label, M equal-mass bins, thresholds at the order statistics "
            "r_(ceil(bN/M)), bins (t_{b-1}, t_b]; exact per case, pooled from a fine histogram with a stated error "
            "bound")),
        _calibration_figure("smooth_ece", "smECE", shows("posthoc", "shift", "report", "predictor"),
                            protocol=_per_region(
                                "top-label smooth ECE (Blasiok & Nakkiran 2024) as relplot.smECE: reflected Gaussian "
                                "kernel, bandwidth by relplot's bisection for the fixed point; from 2^20 equal cells "
                                "of five sums each (differences to relplot below 1e-9)")),
        _calibration_figure("signed_ece", "signed ECE", shows("posthoc", "shift", "predictor"), better=0,
                            protocol=_per_region("sum_b |B_b|/N (conf - acc) over the ECE's bins = mean confidence - "
                                                 "accuracy; positive: over-confident")),
        _calibration_figure("nll", "NLL", shows("posthoc", "shift", "predictor"), protocol=_per_region(
            f"mean of -log max(p_y, {NLL_FLOOR:g}) (nats)", "; multilabel: binary, mean over regions")),
        _calibration_figure("brier", "Brier", shows("posthoc", "predictor"), protocol=lambda p, multilabel: (
            "binary (p_r - y_r)^2, mean over regions" if multilabel else
            "sum_k (p_k - 1[y=k])^2 per voxel, not divided by K")),
    )
    class_extras = ("class_ece",)
    case_extras = ("n_region_voxels",)

    def __init__(self, num_classes: int, class_names: Sequence[str], protocol: EvalProtocol,
                 multilabel: bool = False) -> None:
        super().__init__(num_classes, class_names, protocol, multilabel)
        self.keys = tuple(f.key for f in self.figures)
        self.foreground = list(range(num_classes)) if multilabel else list(range(1, num_classes))
        self.stats: list[CalibrationStats | None] = [None] * (num_classes if multilabel else 1)
        self.empty_regions = 0
        self.histogram = np.zeros((len(self.foreground), protocol.n_bins, protocol.n_bins), dtype=np.int64)
        self._pending: list[CalibrationStats] = []

    def score(self, case: CaseView) -> dict:
        values, self._pending = self._case(case)
        return values

    def commit(self) -> None:
        stats = self._pending
        if stats:
            self.histogram = self.histogram + case_histogram(self.histogram_sums(stats))
        self.stats = [s.copy() if p is None else _accumulate(p, s)
                      for p, s in zip(self.stats, stats)] + self.stats[len(stats):]
        self.empty_regions += bool(stats) and any(s.n_voxels == 0 for s in stats)
        self._pending = []

    def merge(self, other: CalibrationScorer) -> None:
        """The pooled statistics and histogram of ``other``'s cases added (of one case: :meth:`commit`'s sums)."""
        self.histogram = self.histogram + other.histogram
        self.stats = [p if s is None else s.copy() if p is None else _accumulate(p, s)
                      for p, s in zip(self.stats, other.stats)]
        self.empty_regions += other.empty_regions

    def _case(self, case: CaseView) -> tuple[dict, list[CalibrationStats]]:
        k, region, n_bins = self.num_classes, self.protocol.region, self.protocol.n_bins
        if case.probs is None:
            return {**{key: math.nan for key in self.keys}, "class_ece": [math.nan] * k, "n_region_voxels": 0}, []
        if not self.multilabel:
            mask = case.region(region, self.protocol.boundary_width_mm)
            cal = case_calibration(case.probs, case.label, n_bins, mask, case.top)
            v = cal.values
            return {**{key: v[key] for key in self.keys}, "class_ece": v["class_ece"],
                    "n_region_voxels": v["n_voxels"]}, [cal.stats]
        cals = [self._binary_calibration(case.probs[r], case.label[r], case.prediction[r], case.spacing)
                for r in range(k)]
        per_region = [self.binary_values(cal.values) for cal in cals]
        return {**{key: nanmean([v[key] for v in per_region]) for key in self.keys},
                "class_ece": [v["class_ece"] for v in per_region],
                "n_region_voxels": sum(v["n_voxels"] for v in per_region)}, [cal.stats for cal in cals]

    def _binary_calibration(self, p, y, pred, spacing):
        """Region r of a multilabel task as a two-class problem (1 - p_r, p_r) on its own voxels."""
        mask = region_mask(self.protocol.region, y.long(), pred.long(), spacing, self.protocol.boundary_width_mm)
        return case_calibration(torch.stack([1.0 - p, p]), y.long(), self.protocol.n_bins, mask)

    @staticmethod
    def binary_values(values: dict) -> dict:
        """Binary reading of two-class values: classwise ECE of the region = ECE of p_r (class 1);
        Brier = (p - y)^2, half the two-class sum."""
        return {**values, "classwise_ece": values["class_ece"][1], "class_ece": values["class_ece"][1],
                "brier": values["brier"] / 2}

    def pooled(self) -> dict:
        """Calibration pooled over every voxel of every case (from the summed bin sums)."""
        stats = [s for s in self.stats if s is not None]
        with_bound = (*self.keys, "adaptive_ece_max_error")
        if not stats:
            return {key: math.nan for key in with_bound} | {"n_voxels": 0}
        values = [s.values() for s in stats]
        if self.multilabel:
            values = [self.binary_values(v) for v in values]
            pooled = {key: nanmean([v[key] for v in values]) for key in with_bound}
            class_ece = [v["class_ece"] for v in values]
        else:
            pooled = {key: values[0][key] for key in with_bound}
            class_ece = values[0]["class_ece"]
        pooled["n_voxels"] = sum(v["n_voxels"] for v in values)
        pooled["class_ece"] = dict(zip(self.class_names, class_ece))
        return pooled

    def filled_stats(self) -> list[CalibrationStats]:
        """The pooled statistics, zeros where no case had probabilities."""
        return [s if s is not None else CalibrationStats.zeros(2 if self.multilabel else self.num_classes,
                                                                self.protocol.n_bins) for s in self.stats]

    def histogram_sums(self, stats: list[CalibrationStats]) -> BinSums:
        """Classwise bin sums of the histogram's panels: the foreground classes (the margin-loss authors'
        ``include_background=False``), or p_r against y_r per region when multilabel."""
        if self.multilabel:
            return BinSums.stack([s.classwise[1] for s in stats])
        return stats[0].classwise[self.foreground]


class PECEScorer(Scorer):
    """pECE (:mod:`mcseg.metrics.pece`; the SDC authors' foreground ECE with a false-positive offset, 10 bins,
    offset weight 2) of a case over ALL its voxels, whatever the protocol's calibration region (as the authors).
    Softmax tasks: foreground confidence 1 - p_0 against label != 0; multilabel: p_r against y_r per region, the
    case's value the mean over regions. NaN for a label map without probabilities."""

    figures = (Figure("pece", f"pECE ({PECE_BINS} bins, FP weight {PECE_FP_WEIGHT:g})", "case", "calibration", -1,
                      protocol=_per_region(PECE_DESCRIPTION, "; multilabel: p_r against y_r, mean over regions")),)

    def score(self, case: CaseView) -> dict:
        if case.probs is None:
            return {"pece": math.nan}
        if self.multilabel:
            return {"pece": nanmean([pece(case.probs[r], case.label[r] > 0) for r in range(self.num_classes)])}
        return {"pece": pece(case.probs[0], case.label, of_background=True)}

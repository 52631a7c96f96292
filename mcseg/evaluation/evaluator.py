"""The evaluation protocol: per-case overlap, distance and calibration, pooled calibration,
summary statistics over cases, reliability diagrams. See docs/protocol.md.

One :class:`Evaluator` serves validation during training, ``evaluate.py`` and the folder
evaluator: ``add_case`` once per case (probabilities on any device), then ``summary`` or
``write``. Calibration is accumulated as per-bin sums, so the memory does not grow with the
number of voxels evaluated, only with the number of cases (one row of numbers each).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mcseg.metrics.uncertainty import entropy

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from mcseg.config import EvalProtocol
from mcseg.evaluation.raters import (
    CASE_FIGURES, CLASS_FIGURES, RATER_COLUMNS, RELIABILITY_COLUMNS, RELIABILITY_FILE, RaterFigures,
)
from mcseg.files import atomic_write, write_csv
from mcseg.evaluation import figure_table as figures
from mcseg.evaluation.figure_declaration import KINDS
from mcseg.evaluation.figure_processes import FigureProcesses
from mcseg.evaluation.scorers import CalibrationScorer, CaseView
from mcseg.metrics.binning import BinSums
from mcseg.metrics.calibration import top_label
from mcseg.metrics.empty import StructureStatus, status_counts
from mcseg.metrics.regions import region_mask
from mcseg.metrics.reliability import HISTOGRAM_COLUMNS, TABLE_COLUMNS, histogram_figure, histogram_table
from mcseg.metrics.reliability import reliability_table
from mcseg.metrics.reliability import reliability_figure as _figure
from mcseg.metrics.statistics import describe, nanmean
from mcseg.runtime import keep_freed_memory
from mcseg.text import plural

__all__ = ["Evaluator", "entropy_map", "reliability_figure"]



def entropy_map(probs: torch.Tensor, multilabel: bool = False) -> torch.Tensor:
    """Voxelwise entropy (nats) of the predictive distribution, ``*spatial`` float32.

    Softmax: H = -sum_k p_k log p_k (0 log 0 = 0), at most log K. Multilabel (independent
    sigmoids): the entropy of the joint distribution, sum_r H_b(p_r) with the binary entropy
    H_b(p) = -p log p - (1-p) log(1-p), at most R log 2.
    """
    return entropy(probs.float(), multilabel)



def _json_safe(obj):
    """NaN and inf become null (strict JSON; equal across runs, unlike NaN)."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _fmt(value) -> str:
    return repr(float(value)) if isinstance(value, (float, np.floating)) else str(value)


class Evaluator:
    """Per-case and pooled evaluation of one split under an :class:`EvalProtocol`.

    Softmax tasks: ``probs`` is ``K x *spatial``, the prediction its argmax, per-class rows for
    the foreground classes 1..K-1. Multilabel tasks: ``probs`` is ``R x *spatial`` of sigmoid
    probabilities, the prediction ``probs > 0.5`` per region, one row per region, and each
    calibration value is the mean over regions of that region's binary value (docs/protocol.md).
    """

    def __init__(self, num_classes: int, class_names: list[str], protocol: EvalProtocol,
                 multilabel: bool = False, raters: bool = False) -> None:
        if len(class_names) != num_classes:
            raise ValueError(f"{len(class_names)} class names for num_classes={num_classes}: {class_names}")
        if num_classes < (1 if multilabel else 2):
            raise ValueError(f"num_classes={num_classes} is too small for a {'multilabel' if multilabel else 'softmax'} task")
        if len(set(class_names)) != len(class_names):
            raise ValueError(f"class names must be unique, got {class_names}")
        self.num_classes, self.class_names, self.protocol, self.multilabel = (
            num_classes, list(class_names), protocol, multilabel)
        self.with_raters = raters  # cases come with several raters' maps: the scorers against them too
        self.foreground = list(range(num_classes)) if multilabel else list(range(1, num_classes))
        # a case's temporaries (a few MB on a small case) reused from one case to the next instead of faulted in
        # again (mcseg.runtime; without it a hippocampus-size case took about 15% more process time), as
        # evaluate.py, the folder commands and training already do: here also for an evaluator used from Python
        keep_freed_memory()
        self.reset()

    def reset(self) -> None:
        self._cases: list[dict] = []
        self._ids: set[str] = set()
        # the per-case scorers of the table of figures (mcseg.evaluation.figure_table.SCORERS), read now
        self.scorers = [cls(self.num_classes, self.class_names, self.protocol, self.multilabel)
                        for cls in figures.active_scorers(self.num_classes, self.multilabel, self.with_raters)]
        found = [s for s in self.scorers if isinstance(s, CalibrationScorer)]
        if len(found) != 1:
            raise ValueError("the table of figures needs exactly one CalibrationScorer (reliability diagrams and "
                             f"pooled calibration come from it), found {len(found)}")
        self.calibration = found[0]
        self._raters: RaterFigures | None = None
        self._last_case: CaseView | None = None

    def __getstate__(self) -> dict:
        """Pickled (a worker's evaluator) without the last case's maps: rows and sums only."""
        return {**self.__dict__, "_last_case": None}

    def _keys(self, per: str) -> tuple[str, ...]:
        return tuple(f.key for s in self.scorers for f in s.figures if f.per == per)

    @property
    def class_columns(self) -> tuple[str, ...]:
        """Per-class columns of per_case.csv: the per-class figures, then the scorers' extra columns."""
        return (*self._keys("class"), *(e for s in self.scorers for e in s.class_extras))

    @property
    def case_columns(self) -> tuple[str, ...]:
        """Per-case columns of per_case.csv (repeated on a case's rows)."""
        return (*self._keys("case"), *(e for s in self.scorers for e in s.case_extras), "region")

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of per_case.csv."""
        return ("case", "class_index", "class_name", *self.class_columns, *self.case_columns)

    @property
    def n_cases(self) -> int:
        return len(self._cases)

    # ---------------------------------------------------------------- one case
    def add_case(self, case_id: str, probs: torch.Tensor | None, label: torch.Tensor, spacing: Sequence[float],
                 prediction: torch.Tensor | None = None, raters: torch.Tensor | np.ndarray | None = None,
                 rater_names: Sequence[str] | None = None, samples: torch.Tensor | None = None,
                 image: torch.Tensor | np.ndarray | None = None) -> dict:
        """Evaluate one case; returns its metrics as a flat dict (also kept for per_case.csv).

        Args:
            probs: ``C x *spatial`` probabilities on any device (softmax, or one sigmoid per
                region when multilabel); None to evaluate a label map without calibration.
            label: ``*spatial`` integer labels (``R x *spatial`` binary when multilabel).
            spacing: voxel size in mm per spatial axis, in the array's axis order.
            prediction: the label map to score (same layout as ``label``); default: argmax of
                ``probs`` (``probs > 0.5`` when multilabel). Calibration always uses ``probs``.
            raters: ``K x *spatial`` label maps of the case's raters (a dataset with several raters; only to an
                evaluator built with ``raters=True``): the figures against them (:mod:`mcseg.evaluation.raters`)
                go to the ``raters`` key of the summary, and the scorers with ``needs_raters`` (the table of
                figures: CURVAS-PDACVI's thresholded Dice) to per_case.csv and the summary's means.
            rater_names: their names (``seg01``, ``annotation_2``...), for per_rater.csv.
            samples: ``N x *spatial`` label maps of the predictor's members (GED, Hungarian-matched IoU).
            image: the raw ``*spatial`` CT (HU), for ``evaluation.rater_crop=curvas2024``.
        """
        if case_id in self._ids:
            raise ValueError(f"case {case_id!r} was already added to this evaluator")
        if probs is None and prediction is None:
            raise ValueError(f"case {case_id}: give probabilities, a prediction, or both")
        device = probs.device if probs is not None else prediction.device
        label = torch.as_tensor(label, device=device)
        spatial = tuple(label.shape[1:] if self.multilabel else label.shape)
        spacing = tuple(float(s) for s in spacing)
        self._check(case_id, probs, label, spacing, spatial)
        if probs is not None and probs.dtype in (torch.float16, torch.bfloat16):
            probs = probs.float()
        top = top_label(probs) if probs is not None and not self.multilabel else None
        if prediction is None:
            prediction = probs > 0.5 if self.multilabel else top[1].view(spatial)
        prediction = torch.as_tensor(prediction, device=device)
        if prediction.shape != label.shape:
            raise ValueError(f"case {case_id}: prediction shape {tuple(prediction.shape)} != label shape "
                             f"{tuple(label.shape)}")
        if raters is not None:
            if self.multilabel or probs is None:
                raise ValueError(f"case {case_id}: figures against several raters need softmax probabilities")
            if not self.with_raters:
                raise ValueError(f"case {case_id}: raters' maps given to an evaluator built without them "
                                 "(Evaluator(..., raters=True) scores against several raters)")
            raters = torch.as_tensor(np.asarray(raters) if not isinstance(raters, torch.Tensor) else raters,
                                     device=device)
        view = CaseView(case_id, probs, label, prediction, spacing, top, raters)
        self._last_case = None  # the last case's maps and regions (region_of), not its probabilities
        case = {"case": case_id}
        try:
            for scorer in self.scorers:
                case.update(scorer.score(view))
        except ValueError as exc:
            raise ValueError(f"case {case_id}: {exc}") from None
        rater_case = None
        if raters is not None:
            if self._raters is None:
                p = self.protocol
                self._raters = RaterFigures(self.num_classes, self.class_names, p.n_bins, p.hd_percentile,
                                            p.hd_definition, p.rater_thresholds, p.rater_volume_crps, p.rater_crop)
            try:
                rater_case = self._raters.add_case(case_id, probs, prediction, raters, spacing, rater_names, samples,
                                                   None if image is None else torch.as_tensor(np.asarray(image)))
            except ValueError as exc:
                raise ValueError(f"case {case_id}: {exc}") from None
        for scorer in self.scorers:  # commit only a fully evaluated case
            scorer.commit()
        self._cases.append(case)
        self._ids.add(case_id)
        self._last_case = dataclasses.replace(view, probs=None, top=None, regions=view.regions)
        flat = self._flat(case)
        if rater_case is not None:
            flat.update({f"raters/{key}": rater_case[key] for key in CASE_FIGURES})
            for k in self.foreground:
                flat.update({f"raters/{key}/{self.class_names[k]}": rater_case[key][k] for key in CLASS_FIGURES})
        return flat

    def merge(self, other: Evaluator) -> None:
        """Add the cases of ``other``, an evaluator of the same task and protocol (a worker's, holding one case:
        :mod:`mcseg.evaluation.case_pool`), after those added here. Merged one case at a time in case order, the
        per-case rows, pooled sums and figures are those of :meth:`add_case` on each case, to the last bit."""
        if (other.num_classes, other.class_names, other.multilabel, other.protocol) != (
                self.num_classes, self.class_names, self.multilabel, self.protocol):
            raise ValueError("merge: the evaluators differ in task or protocol")
        twice = sorted(self._ids & other._ids)
        if twice:
            raise ValueError(f"merge: case(s) {', '.join(twice[:10])} were already added to this evaluator")
        if other._raters is not None and other._raters.cases:
            raise ValueError("merge: figures against several raters are scored in one evaluator")
        for mine, theirs in zip(self.scorers, other.scorers):
            mine.merge(theirs)
        self._cases += other._cases
        self._ids |= other._ids

    def _check(self, case_id, probs, label, spacing, spatial) -> None:
        if len(spacing) != len(spatial) or not all(math.isfinite(s) and s > 0 for s in spacing):
            raise ValueError(f"case {case_id}: spacing {spacing} does not fit the spatial shape {spatial}")
        if self.multilabel and label.shape[0] != self.num_classes:
            raise ValueError(f"case {case_id}: multilabel label has {label.shape[0]} regions, "
                             f"expected {self.num_classes}")
        if probs is None:
            return
        if tuple(probs.shape) != (self.num_classes, *spatial):
            raise ValueError(f"case {case_id}: probabilities of shape {tuple(probs.shape)}, expected "
                             f"{(self.num_classes, *spatial)} (channels first, {self.num_classes} classes)")
        # cheap sanity check on a strided subsample: probabilities, not logits
        sample = probs.reshape(probs.shape[0], -1)[:, ::97].float()
        if not bool(torch.isfinite(sample).all()) or sample.min() < 0 or sample.max() > 1:
            raise ValueError(f"case {case_id}: probabilities must be finite and in [0, 1] (logits given?)")
        if not self.multilabel and bool((sample.sum(0) - 1).abs().max() > 1e-3):
            raise ValueError(f"case {case_id}: softmax probabilities do not sum to 1 over the channels")

    def region_of(self, label: torch.Tensor, prediction: torch.Tensor, spacing,
                  region: str | None = None) -> torch.Tensor | None:
        """The voxel region ``region`` (default: the protocol's) of one case (None: every voxel); multi-label:
        the union of the regions' own (failure detection scores a voxel once)."""
        def one(y, p):
            return region_mask(region or self.protocol.region, y, p, spacing, self.protocol.boundary_width_mm)
        if not self.multilabel:
            last = self._last_case
            if last is not None and _same_case(last, label, prediction, spacing):  # computed once (CaseView.region)
                return last.region(region or self.protocol.region, self.protocol.boundary_width_mm)
            return one(label, prediction)
        masks = [one(label[r].long(), prediction[r].long()) for r in range(label.shape[0])]
        return None if any(m is None for m in masks) else torch.stack(masks).any(0)

    def _case_values(self, case: dict) -> dict:
        """The case's per-case columns (figures, extras, the region's name)."""
        return {key: case[key] for key in self.case_columns[:-1]} | {"region": self.protocol.region}

    def _flat(self, case: dict) -> dict:
        flat = {"case": case["case"], **self._case_values(case)}
        for key in self._keys("class"):
            flat[f"mean_foreground_{key}"] = nanmean([case[key][k] for k in self.foreground])
        for k in self.foreground:
            name = self.class_names[k]
            flat.update({f"{key}/{name}": case[key][k] for key in self.class_columns})
        return flat

    # ---------------------------------------------------------------- over cases
    def pooled_values(self) -> dict:
        """The ``pooled`` figures over every voxel of every case (calibration: from the summed bin sums)."""
        pooled: dict = {}
        for scorer in self.scorers:
            pooled.update(scorer.pooled())
        return pooled

    def summary(self) -> dict:
        """The content of summary.json (undefined values are None)."""
        b, seed = self.protocol.bootstrap_samples, self.protocol.seed
        cases = self._cases
        fg = self.foreground
        class_keys, case_keys = self._keys("class"), self._keys("case")
        foreground = {key: describe([nanmean([c[key][k] for k in fg]) for c in cases], b, seed) for key in class_keys}
        calibration = {key: describe([c[key] for c in cases], b, seed) for key in case_keys}
        statuses = status_counts([[StructureStatus(v) for v in c["status"]] for c in cases], self.num_classes)
        per_class = {}
        for k in fg:
            entry = {key: describe([c[key][k] for c in cases], b, seed)
                     for key in self.class_columns if key != "status"}
            entry["counts"] = {status: n[k] for status, n in statuses.items()}
            per_class[self.class_names[k]] = entry
        counts = {s.value: sum(e["counts"][s.value] for e in per_class.values()) for s in StructureStatus}
        counts["empty_region_cases"] = self.calibration.empty_regions
        summary = {
            "n_cases": len(cases),
            "multilabel": self.multilabel,
            "classes": [self.class_names[k] for k in fg],
            **{f"mean_foreground_{key}": foreground[key]["mean"] for key in class_keys},
            **{f"mean_{key}": calibration[key]["mean"] for key in case_keys},
            "foreground": foreground,
            "calibration": calibration,
            "per_class": per_class,
            "counts": counts,
            "pooled": self.pooled_values(),
            "protocol": self.protocol_description(),
        }
        if self._raters is not None and self._raters.cases:
            summary["raters"] = self._raters.summary(b, seed)
        return _json_safe(summary)

    def figure_definitions(self) -> dict[str, str]:
        """What each figure this evaluator scores is, as its declaration states it (``Figure.protocol``), by kind
        (calibration, segmentation, failure), then in the table's order (a stable sort)."""
        declared = sorted((f for scorer in self.scorers for f in scorer.figures), key=lambda f: KINDS.index(f.kind))
        texts = {f.protocol_key or f.key: f.protocol_text(self.protocol, self.multilabel) for f in declared}
        return {key: text for key, text in texts.items() if text is not None}

    def protocol_description(self) -> dict:
        p = self.protocol
        return {
            **asdict(p),
            "num_classes": self.num_classes,
            "class_names": self.class_names,
            "multilabel": self.multilabel,
            "prediction": "probs > 0.5 per region" if self.multilabel else "argmax of the probabilities (first maximum)",
            "bins": f"{p.n_bins} equal-width bins (lo, hi], 0 in the first bin (Guo et al. 2017)",
            **self.figure_definitions(),
            "surface": "voxels of the structure with a face neighbour outside it or on the image border",
            "empty_policy": {"both_empty": "Dice, HD, ASSD undefined (NaN): excluded from means, counted",
                             "missed": "Dice 0; HD and ASSD = image diagonal in mm; counted",
                             "false_alarm": "Dice 0; HD and ASSD = image diagonal in mm; counted",
                             "empty_region": "calibration values undefined (NaN) for the case: excluded, counted"},
            "aggregation": "mean_* keys: mean over cases of per-case values (foreground: the per-case mean over "
                           "foreground classes), NaN excluded; 'pooled': all voxels of all cases together",
            "confidence_interval": f"95% percentile bootstrap over cases, {p.bootstrap_samples} resamples, seed {p.seed}",
        }

    # ---------------------------------------------------------------- reliability and files
    def reliability_sums(self) -> tuple[BinSums, list[str]]:
        """Pooled bin sums of every reliability panel (top-label, then per class or region)."""
        stats = self.calibration.filled_stats()
        if self.multilabel:
            rows = [s.top for s in stats] + [s.classwise[1] for s in stats]
            names = [f"{n} top-label" for n in self.class_names] + [f"{n} (p vs y)" for n in self.class_names]
        else:
            rows = [stats[0].top] + [stats[0].classwise[k] for k in range(self.num_classes)]
            names = ["top-label"] + self.class_names
        stacked = BinSums.stack(rows).to("cpu")
        return stacked, names

    def histogram_panels(self) -> tuple[np.ndarray, list[str], np.ndarray]:
        """The dataset reliability histogram (P, M, M) [panel, frequency bin, confidence bin] summed
        over the cases, its panel names, and the pooled voxel counts (P, M) per confidence bin."""
        voxels = self.calibration.histogram_sums(self.calibration.filled_stats()).count.cpu().numpy()
        return self.calibration.histogram.copy(), [self.class_names[k] for k in self.foreground], voxels

    def per_case_rows(self) -> list[dict]:
        rows = []
        for case in self._cases:
            shared = self._case_values(case)
            for k in self.foreground:
                rows.append({"case": case["case"], "class_index": k, "class_name": self.class_names[k],
                             **{key: case[key][k] for key in self.class_columns}, **shared})
        return rows

    def write(self, out_dir: Path, extra: dict | Callable[[], dict] | None = None) -> dict:
        """Write per_case.csv, summary.json (plus ``extra`` keys), reliability.png and reliability.csv, and the
        dataset reliability histogram reliability_histogram.png and .csv (atomically); with several raters
        also per_case_raters.csv, per_rater.csv and reliability_raters.csv. ``extra`` may be a function that
        returns the keys: it is called once the figures' processes are drawing (work that can run beside them)."""
        out_dir = Path(out_dir)
        sums, names = self.reliability_sums()
        hist, hist_names, voxels = self.histogram_panels()
        with FigureProcesses() as drawing:  # drawn beside the summary and the tables (figure_processes)
            if self.protocol.figures:
                self._start_figures(drawing, out_dir, (sums, names), (hist, hist_names, voxels))
            summary = {**self.summary(), **_json_safe((extra() if callable(extra) else extra) or {})}
            _write_csv(out_dir / "per_case.csv", self.per_case_rows(), self.columns)
            if self._raters is not None and self._raters.cases:
                _write_csv(out_dir / "per_case_raters.csv", self._raters.rows(), ("case", "class_name",
                                                                                   *CLASS_FIGURES, *CASE_FIGURES))
                _write_csv(out_dir / "per_rater.csv", self._raters.rater_rows, RATER_COLUMNS)
                _write_csv(out_dir / RELIABILITY_FILE, self._raters.reliability_rows(), RELIABILITY_COLUMNS)
            atomic_write(out_dir / "summary.json",
                         lambda tmp: tmp.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n"))
            _write_csv(out_dir / "reliability.csv", reliability_table(sums, names), TABLE_COLUMNS)
            _write_csv(out_dir / "reliability_histogram.csv", histogram_table(hist, hist_names), HISTOGRAM_COLUMNS)
            drawing.wait()
        return summary

    def _start_figures(self, drawing: FigureProcesses, out_dir: Path, reliability: tuple, histogram: tuple) -> None:
        """reliability.png and reliability_histogram.png (from :meth:`reliability_sums` and
        :meth:`histogram_panels`), each drawn by its own process from its numbers (a module-level function and its
        arguments: they may be sent to a drawer, figure_processes)."""
        cases = plural(self.n_cases, "case")
        sums, names = reliability
        p = self.protocol
        drawing.start(out_dir / "reliability.png", _figure, sums, names,
                      f"{out_dir.name}: {cases} pooled; region {p.region}, {p.n_bins} bins")
        hist, names, voxels = histogram
        drawing.start(out_dir / "reliability_histogram.png", histogram_figure, hist, names, voxels=voxels,
                      total="all regions" if self.multilabel else "all foreground",
                      title=f"{out_dir.name}: dataset reliability histogram, {cases}; region {p.region}")


def _same_case(view: CaseView, label: torch.Tensor, prediction: torch.Tensor, spacing) -> bool:
    """Whether ``label``, ``prediction`` and ``spacing`` are those of ``view`` (the same tensors, or equal ones)."""
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a is b or (a.shape == b.shape and a.device == b.device and bool(torch.equal(a.to(b.dtype), b)))
    return tuple(float(s) for s in spacing) == view.spacing and same(label, view.label) and same(prediction,
                                                                                                  view.prediction)


def _write_csv(path: Path, rows: list[dict], columns: Sequence[str]) -> None:
    """The evaluator's tables: every column of every row (floats as their repr, ``None`` as ``None``), ``\\n``."""
    write_csv(path, ({key: _fmt(row[key]) for key in columns} for row in rows), columns, lineterminator="\n")


def reliability_figure(source: Evaluator | BinSums, names: Sequence[str] | None = None, title: str = "") -> Figure:
    """Reliability diagrams as a matplotlib Figure (Agg canvas), e.g. for TensorBoard.

    ``source``: an :class:`Evaluator` (its pooled top-label panel, then one panel per class, or
    per region when multilabel), or :class:`BinSums` of shape (M,) or (P, M) with panel names.
    """
    if isinstance(source, Evaluator):
        sums, names = source.reliability_sums()
        p = source.protocol
        title = title or f"{plural(source.n_cases, 'case')} pooled"
        title += f"; region {p.region}, {p.n_bins} bins"
        return _figure(sums, names, title)
    return _figure(source, names, title)


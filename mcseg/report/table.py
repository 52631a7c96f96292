"""The comparison table: one row per configuration, seeds aggregated, selection by validation, tests.

Runs on different datasets are never compared: rows, selection and baseline are per dataset. A
second run of a configuration with a seed already present is left out (``duplicate_of``), so the
std over seeds is over distinct seeds. For each configuration (runs that differ only in their seed):
* mean ± std over seeds of each run's summary value (the evaluator's mean over cases);
* a 95% percentile-bootstrap interval over cases of the per-case values averaged over seeds;
* ``pre_T`` (raw outputs) and ``post_T`` (after temperature scaling) calibration columns;
* per post-hoc scaler found in the evaluations (temperature, vector, lts, ...): its Dice, HD95, ECE and
  classwise ECE, labelled with how it was fitted (``ConfigRow.posthoc``, the report's post_T rows), and
  whether it changed the segmentation and by how much (``ConfigRow.posthoc_segmentation``);
* where the evaluations scored several raters (summary.json ``raters``, per_case_raters.csv), the figures
  against them (``RATER_METRICS``, ``ConfigRow.raters``) as the same cells of the raw outputs; none otherwise.

Each loss's hyperparameters are selected by the mean over seeds of a validation value from
``result.json`` (default ``score``, the config's weighted validation score); the test split never
takes part. Each configuration is compared with the selected configuration of the baseline loss
by a two-sided Wilcoxon signed-rank test over cases (per-case values averaged over seeds,
cases undefined in either excluded), per metric, uncorrected for multiple comparisons.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from mcseg.environment import environment_differences
from mcseg.evaluation.figure_table import shown_in
from mcseg.metrics.statistics import bootstrap_ci, describe
from mcseg.report.collect import RunRecord


def metrics() -> tuple[tuple[str, str, str, str, int, bool], ...]:
    """The comparison table's columns, from the table of figures ("report"): (column, summary key, per-case key,
    scaler: "" raw outputs, "temperature" post-T, better: +1 higher / -1 lower / 0 nearer zero, tested: a
    bootstrap interval over cases and a paired test against the baseline, as the figure declares); calibration
    figures also after the temperature."""
    reported = shown_in("report")
    return (*((f.key, f.summary_key, f.key, "", f.better, f.tested) for f in reported),
            *((f"{f.key}_post_T", f.summary_key, f.key, "temperature", f.better, f.tested) for f in reported
              if f.kind == "calibration"))

# Against several raters, beside the single-label columns: (column, summary "raters" group, figure); the summary
# value is raters.<group>.<figure>.mean, the per-case one per_case_raters.csv's (docs/protocol.md, "Several raters")
RATER_METRICS = (
    ("dice_raters", "foreground", "dice_rater_mean"), ("consensus_dice", "foreground", "consensus_dice"),
    ("thresholded_dice", "foreground", "thresholded_dice"), ("ece_rater_mean", "case", "ece_mean"),
    ("ece_curvas", "case", "ece_curvas_rater_mean"), ("nll_rater_mean", "case", "nll_mean"),
    ("volume_crps", "foreground", "volume_crps"), ("ged", "case", "ged"), ("hm_iou", "case", "hm_iou"),
)
RATER_PATHS = {column: ("raters", group, figure, "mean") for column, group, figure in RATER_METRICS}


def predictor_columns() -> dict[str, tuple[str, ...]]:
    """The columns of the predictor table (single network, + T, ensembles, TTA, MC dropout), from the table of
    figures ("predictor"): summary paths, mean ± std over the predictor's evaluations (a split-level figure has
    no per-case values to resample)."""
    return {f.key: f.summary_path for f in shown_in("predictor")}

# The columns of a post-hoc scaler's post_T row: (column, summary key, per-case key, tested)
def posthoc_metrics() -> tuple[tuple[str, str, str, bool], ...]:
    return tuple((name, key, case_key, tested) for name, key, case_key, scaler, _, tested in metrics() if scaler == "")


@dataclass
class MetricCell:
    mean: float
    std: float
    ci95: tuple[float, float]
    n_cases: int
    p_vs_baseline: float | None = None
    tested: bool = True  # False: the figure declares no interval nor test (ci95 NaN, no p-value)


@dataclass
class ConfigRow:
    dataset: str
    loss_name: str
    configuration: str
    hyperparameters: str
    runs: list[RunRecord]
    seeds: list[int]
    selection_value: float | None
    cells: dict[str, MetricCell | None] = field(default_factory=dict)
    selected: bool = False
    baseline: bool = False
    temperature: float | None = None
    posthoc: dict[str, dict[str, MetricCell | None]] = field(default_factory=dict)  # scaler -> column -> cell
    posthoc_labels: dict[str, str] = field(default_factory=dict)  # scaler -> how it was fitted
    posthoc_segmentation: dict[str, str] = field(default_factory=dict)  # scaler -> segmentation_cell
    predictors: dict[str, dict[str, tuple[float, float, int] | None]] = field(default_factory=dict)
    environment_differs: list[str] = field(default_factory=list)  # e.g. ["code"]: some run differs from the most common
    seen_in_training: list[str] = field(default_factory=list)  # runs whose scored cases include trained-on content
    shift: dict[str, dict] = field(default_factory=dict)  # suite -> predictor -> ShiftCells (mcseg.report.shift)
    raters: dict[str, MetricCell | None] = field(default_factory=dict)  # RATER_METRICS; {}: no run has raters


def _mean_std(values: list[float | None]) -> tuple[float, float]:
    """Mean and std (ddof=1) over the defined values (None and NaN left out)."""
    stats = describe([math.nan if v is None else v for v in values], n_boot=0)
    return stats["mean"], stats["std"]


def case_means(runs: list[RunRecord], scaler: str, key: str) -> dict[str, float]:
    """Per case: the value averaged over the runs (seeds) that have it defined."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for case, metrics in run.per_case.get(scaler, {}).items():
            if key in metrics:  # a figure against raters: only in the evaluations that scored raters
                values.setdefault(case, []).append(metrics[key])
    return {case: _mean_std(v)[0] for case, v in values.items()}


def _cell(runs: list[RunRecord], summary_key: str | tuple[str, ...], case_key: str, scaler: str, n_boot: int,
          seed: int, tested: bool = True) -> MetricCell | None:
    """The cell of a summary value (a key, or a path into nested keys) and, where ``tested``, the bootstrap
    interval of its per-case values."""
    with_values = [r for r in runs if scaler in r.summaries]
    if not with_values:
        return None
    path = summary_key if isinstance(summary_key, tuple) else (summary_key,)
    mean, std = _mean_std([_value(r.summaries[scaler], path) for r in with_values])
    per_case = np.asarray([v for v in case_means(with_values, scaler, case_key).values() if not math.isnan(v)])
    if not tested:
        return MetricCell(mean, std, (math.nan, math.nan), int(per_case.size), tested=False)
    return MetricCell(mean, std, bootstrap_ci(per_case, n_boot, seed), int(per_case.size))


def rater_cells(runs: list[RunRecord], n_boot: int, seed: int) -> dict[str, MetricCell | None]:
    """The ``RATER_METRICS`` cells of the runs that scored several raters ({} when none did); None where no
    evaluation has the figure (GED and HM-IoU without a predictor's samples)."""
    with_raters = [r for r in runs if r.summaries.get("", {}).get("raters")]
    if not with_raters:
        return {}
    cells = {column: _cell(with_raters, RATER_PATHS[column], f"raters/{figure}", "", n_boot, seed)
             for column, _, figure in RATER_METRICS}
    return {column: None if cell is None or (cell.n_cases == 0 and math.isnan(cell.mean)) else cell
            for column, cell in cells.items()}


def paired_wilcoxon(a: dict[str, float], b: dict[str, float]) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value over the cases defined in both; None under 2 pairs."""
    from scipy.stats import wilcoxon  # scipy.stats: seconds to import
    cases = sorted(c for c in a.keys() & b.keys() if not (math.isnan(a[c]) or math.isnan(b[c])))
    x = np.asarray([a[c] for c in cases])
    y = np.asarray([b[c] for c in cases])
    if len(cases) < 2:
        return None
    if np.all(x == y):
        return 1.0  # identical outputs: no evidence of a difference (scipy refuses all-zero differences)
    return float(wilcoxon(x, y, alternative="two-sided").pvalue)


def common_overrides(configurations: list[str]) -> list[str]:
    """Overrides shared by every configuration (shown once in the report, not in each row)."""
    sets = [set(c.split()) for c in configurations]
    return sorted(set.intersection(*sets)) if sets else []


def _hyperparameters(configuration: str, loss_name: str, common: set[str]) -> str:
    parts = [p for p in configuration.split() if p != f"loss={loss_name}" and p not in common]
    return " ".join(parts) or "defaults"


def _configuration_label(members: list[RunRecord]) -> str:
    """The overrides that name a configuration; runs that spelled the same one differently (a default
    written out) show the shortest spelling."""
    return min((r.configuration for r in members), key=lambda c: (len(c.split()), c))


def label_datasets(runs: list[RunRecord]) -> None:
    """Datasets are told apart by content: where one name (``msd``) covers data of different content
    (two roots), each is labelled with the start of its content hash, so rows never mix them."""
    keys: dict[str, set[str]] = {}
    for run in runs:
        keys.setdefault(run.dataset, set()).add(run.dataset_key)
    for run in runs:
        if len(keys[run.dataset]) > 1 and run.dataset_key != run.dataset:
            run.dataset = f"{run.dataset} [{run.dataset_key[:8]}]"


def _natural(text: str) -> list:
    """Sort key in which numbers compare as numbers: margin=3 < margin=5 < margin=10."""
    return [float(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+(?:\.\d+)?)", text))]


def build_rows(runs: list[RunRecord], select: str = "score", select_mode: str = "max", baseline: str | None = "ce",
               n_boot: int = 1000, seed: int = 0) -> list[ConfigRow]:
    """Group evaluated runs into configurations, fill the metric cells, select and test."""
    if select_mode not in ("max", "min"):
        raise ValueError(f"select_mode={select_mode!r}: expected max or min")
    evaluated = [r for r in runs if r.evaluated]
    label_datasets(evaluated)
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    seen: dict[tuple[str, str, int], RunRecord] = {}
    for run in sorted(evaluated, key=lambda r: str(r.path)):
        first = seen.setdefault((run.dataset_key, run.configuration_key, run.seed), run)
        if first is not run:
            run.duplicate_of = first.path
            continue
        groups.setdefault((run.dataset_key, run.configuration_key), []).append(run)
    rows = []
    spelled = {group: _configuration_label(members) for group, members in groups.items()}
    common = set(common_overrides(list(spelled.values())))
    for group, members in groups.items():
        members = sorted(members, key=lambda r: r.seed)
        configuration, dataset = spelled[group], members[0].dataset
        selection = _mean_std([r.result.get(select) for r in members])[0]
        row = ConfigRow(dataset, members[0].loss_name, configuration,
                        _hyperparameters(configuration, members[0].loss_name, common),
                        members, [r.seed for r in members], None if math.isnan(selection) else selection)
        row.cells = {name: _cell(members, key, case_key, scaler, n_boot, seed, tested)
                     for name, key, case_key, scaler, _, tested in metrics()}
        row.raters = rater_cells(members, n_boot, seed)
        params = [r.summaries[""].get("posthoc", {}).get("temperature", {}).get("params", {}) for r in members]
        temps = [p.get("temperature") if isinstance(p, dict) else None for p in params]  # a list: pooled after
        row.temperature = _mean_std([t for t in temps if t is not None])[0] if any(t is not None for t in temps) else None
        labels: dict[str, list[str]] = {}
        for run in members:
            for scaler, after in run.summaries[""].get("posthoc", {}).items():
                label = after.get("label") or scaler  # evaluations of an older version: the name only
                label += DEGENERATE_MARK if degenerate_fit(after) else ""
                if label not in labels.setdefault(scaler, []):
                    labels[scaler].append(label)
        row.posthoc_labels = {scaler: " / ".join(ls) for scaler, ls in labels.items()}  # " / ": seeds differ
        row.posthoc = {scaler: {name: _cell(members, key, case_key, scaler, n_boot, seed, tested)
                                for name, key, case_key, tested in posthoc_metrics()} for scaler in row.posthoc_labels}
        row.posthoc_segmentation = {
            scaler: segmentation_cell([(r.summaries[""].get("posthoc") or {}).get(scaler, {}).get("segmentation")
                                       for r in members]) for scaler in row.posthoc_labels}
        rows.append(row)
    order = {}
    for run in runs:  # losses in the order their first run appears (sweep order)
        order.setdefault(run.loss_name, len(order))
    rows.sort(key=lambda r: (r.dataset, order.get(r.loss_name, 0), _natural(r.configuration)))

    mark_environments(rows)
    mark_seen_in_training(rows)
    sign = 1 if select_mode == "max" else -1
    for dataset, loss in {(r.dataset, r.loss_name) for r in rows}:
        candidates = [r for r in rows if (r.dataset, r.loss_name) == (dataset, loss) and r.selection_value is not None]
        if candidates:
            max(candidates, key=lambda r: sign * r.selection_value).selected = True
    for dataset in sorted({r.dataset for r in rows}):
        _test_against_baseline([r for r in rows if r.dataset == dataset], baseline)
    return rows


def mark_environments(rows: list[ConfigRow]) -> list[str]:
    """Mark each row one of whose runs was made by other code, libraries or another device type than the
    most common among all rows' runs; return the warnings (:func:`mcseg.environment.environment_differences`)."""
    runs = {str(run.path): run.environment for row in rows for run in row.runs}
    warnings, marks = environment_differences(runs)
    for row in rows:
        row.environment_differs = sorted({m for run in row.runs for m in marks[str(run.path)]})
    return warnings


def _value(summary: dict, path: tuple[str, ...]):
    node = summary
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _scaled(summary: dict) -> dict | None:
    """The temperature-scaled headline values of an evaluation, shaped as a summary (no failure figures)."""
    after = (summary.get("posthoc") or {}).get("temperature")
    return None if after is None else {k: after.get(k) for k in ("mean_foreground_dice", "mean_foreground_hd95_mm",
                                                                  "mean_ece", "mean_classwise_ece", "mean_nll",
                                                                  "mean_brier")}


def segmentation_cell(changes: list[dict | None]) -> str:
    """Whether a post-hoc scaler changed the segmentation, over the runs (seeds) of a row, from each evaluation's
    ``posthoc.<scaler>.segmentation`` (:func:`mcseg.evaluation.split.segmentation_change`): ``kept``, or
    ``changed in 2/3 runs: 1.2% of voxels, Dice -0.021, HD95 (mm) +0.40`` (means over the runs of the share of
    voxels whose label moved and of each segmentation figure's difference to the raw outputs, the figures of the
    post-hoc block of the table of figures); '–' where no evaluation measured it."""
    known = [c for c in changes if c]
    if not known:
        return "–"
    changed = [c for c in known if c.get("changed")]
    if not changed:
        return "kept"
    parts = [f"{100 * _mean_std([c.get('fraction_changed') for c in known])[0]:.3g}% of voxels"]
    for f in shown_in("posthoc"):
        if f.kind == "segmentation":
            mean = _mean_std([(c.get("difference") or {}).get(f.summary_key) for c in known])[0]
            parts.append(f"{f.label} {mean:+.{f.digits}f}")
    return f"changed in {len(changed)}/{len(known)} runs: " + ", ".join(parts)


DEGENERATE_MARK = " (degenerate fit)"  # a row scaled by a fit flagged degenerate (mcseg.calibration.posthoc)


def degenerate_fit(after: dict | None) -> bool:
    """Whether a summary's post-hoc entry (``summary["posthoc"][scaler]``) was scaled by a fit flagged
    degenerate: its own, or any network's when each network was scaled before pooling (a list of fits)."""
    params = (after or {}).get("params")
    return any(isinstance(p, dict) and bool(p.get("degenerate"))
               for p in (params if isinstance(params, list) else [params]))


def mean_std_n(values) -> tuple[float, float, int] | None:
    """(mean, std (ddof=1), n) over the defined values (None and NaN left out), or None when there are none."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return (*_mean_std(values), len(values)) if values else None


def predictor_cells(summaries: list[dict]) -> dict[str, tuple[float, float, int] | None]:
    """Per column (:func:`predictor_columns`, then those against several raters): (mean, std, n) over the evaluations
    that have it, or None."""
    return {column: mean_std_n(_value(s, path) for s in summaries)
            for column, path in {**predictor_columns(), **RATER_PATHS}.items()}


POOLED_AFTER = ("-pool-after", ", pool-after", "pool-after")


def predictor_names(name: str, scaler: str) -> tuple[str | None, str]:
    """The report's names of a predictor's raw rows and of its rows after ``scaler`` (``+ T`` for temperature;
    ``(pooled)``: fitted on the pooled prediction). Pooled after scaling (``...pool-after``), its raw pooled
    prediction is that of the same members pooled before (a row already): no raw name, and the scaled one says
    how it was scaled: each network by its own fit, then pooled."""
    short = "T" if scaler == "temperature" else scaler
    for suffix in POOLED_AFTER:
        if name.endswith(suffix):
            return None, f"{name.removesuffix(suffix)} + {short} (each network's, then pooled)"
    return name, f"{name} + {short}" if name == "single" else f"{name} + {short} (pooled)"


def predictor_evaluations(row: ConfigRow, ensembles: list) -> list[tuple[str, dict, dict | None]]:
    """(predictor, summary.json, shift_summary.json or None) of every evaluation of the row's predictors: each
    run's own (``single``), the variants evaluated on its checkpoints (TTA, MC dropout; ``eval/<split>-<tag>/``,
    named by the tag) and the ensembles whose members are all runs of the row (``ensemble of <n>[, <tag>]``;
    :func:`mcseg.report.collect.collect_ensembles`)."""
    found = [("single", run.summaries[""], run.shift.get("")) for run in row.runs]
    found += [(tag, summary, run.shift.get(tag)) for run in row.runs for tag, summary in run.variants.items()]
    paths = {r.path.resolve() for r in row.runs}
    for ensemble in ensembles:
        if ensemble.members and {m.resolve() for m in ensemble.members} <= paths:
            name = f"ensemble of {len(ensemble.members)}" + (f", {ensemble.tag}" if ensemble.tag else "")
            found.append((name, ensemble.summary, ensemble.shift))
    return found


def add_predictors(rows: list[ConfigRow], ensembles: list) -> None:
    """Each row's predictors (:func:`predictor_evaluations`), each raw and after its temperature
    (:func:`predictor_names`): mean ± std over the predictor's evaluations."""
    for row in rows:
        found: dict[str, list[dict]] = {}
        for name, summary, _ in predictor_evaluations(row, ensembles):
            raw, scaled_name = predictor_names(name, "temperature")
            if raw is not None:
                found.setdefault(raw, []).append(summary)
            if (scaled := _scaled(summary)) is not None:
                mark = DEGENERATE_MARK if degenerate_fit((summary.get("posthoc") or {}).get("temperature")) else ""
                found.setdefault(scaled_name + mark, []).append(scaled)
        row.predictors = {name: predictor_cells(s) for name, s in found.items()}


def mark_seen_in_training(rows: list[ConfigRow]) -> list[str]:
    """Mark each row with a run whose evaluation scored cases that are, by content, cases the model was
    trained or validated on (``provenance.seen_in_training``), or, of a calibrated prediction folder, cases its
    calibration was fitted on (``provenance.scored_fit_cases``: ``--allow-fit-cases``); return one warning per
    such run."""
    warnings = []
    for row in rows:
        row.seen_in_training = []
        for run in row.runs:
            provenance = run.summaries.get("", {}).get("provenance") or {}
            seen = dict(provenance.get("seen_in_training") or {})
            if provenance.get("scored_fit_cases"):
                seen["calibration fit"] = provenance["scored_fit_cases"]
            if seen:
                row.seen_in_training.append(str(run.path))
                warnings.append(f"{run.path}: its scored cases include "
                                + ", ".join(f"{len(hits)} of its {part} cases" for part, hits in seen.items()))
    return warnings


def _test_against_baseline(rows: list[ConfigRow], baseline: str | None) -> None:
    """Wilcoxon p-values of each row against the selected configuration of ``baseline`` (rows of one dataset)."""
    reference = next((r for r in rows if r.loss_name == baseline and r.selected), None)
    if reference is not None:
        reference.baseline = True
        for row in rows:
            if row is reference:
                continue
            for name, _, case_key, scaler, _, tested in metrics():
                cell = row.cells.get(name)
                if tested and cell is not None and reference.cells.get(name) is not None:
                    cell.p_vs_baseline = paired_wilcoxon(case_means(row.runs, scaler, case_key),
                                                         case_means(reference.runs, scaler, case_key))
            for name, _, figure in RATER_METRICS:
                cell = row.raters.get(name)
                if cell is not None and reference.raters.get(name) is not None:
                    cell.p_vs_baseline = paired_wilcoxon(case_means(row.runs, "", f"raters/{figure}"),
                                                         case_means(reference.runs, "", f"raters/{figure}"))

"""The comparison table as Markdown, CSV and LaTeX (all three from the same rows)."""
from __future__ import annotations

import math
from pathlib import Path

from mcseg.files import write_csv
from mcseg.evaluation import figure_table as figures
from mcseg.evaluation.shift import shift_metrics
from mcseg.report.table import RATER_METRICS, RATER_PATHS, ConfigRow, MetricCell, metrics, posthoc_metrics

# the figures against several raters (RATER_METRICS): headers and digits
RATER_HEADERS = {
    "dice_raters": "Dice vs raters", "consensus_dice": "consensus Dice", "thresholded_dice": "thresholded Dice",
    "ece_rater_mean": "ECE vs rater mean", "ece_curvas": "ECE per rater (CURVAS)",
    "nll_rater_mean": "NLL vs rater mean",
    "volume_crps": "volume CRPS (mL)", "ged": "GED", "hm_iou": "HM-IoU",
}
RATER_DIGITS = {"volume_crps": 2}
RATER_FIGURE = "reliability_raters"
ENVIRONMENT_MARK = " †"  # a run of the row was made by other code, libraries or device type (report's warnings)
SEEN_MARK = " ‡"  # a run of the row scored cases it was trained or validated on (by content)


def headers() -> dict[str, str]:
    """Column headers: the table of figures (calibration figures marked pre_T, and their post_T columns, in the
    comparison table), then the figures against several raters."""
    table = figures.table()
    return {**{f.key: f.label + (" pre_T" if f.kind == "calibration" else "") for f in table},
            **{f"{f.key}_post_T": f"{f.label} post_T" for f in table if f.kind == "calibration"}, **RATER_HEADERS}


def digits(name: str) -> int:
    """Digits of column ``name`` (a figure, its post_T column or a figure against raters)."""
    key = name.removesuffix("_post_T")
    found = [f.digits for f in figures.table() if f.key == key]
    return found[0] if found else RATER_DIGITS.get(name, 3)


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _p(p: float | None) -> str:
    if p is None:
        return ""
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def cell_text(cell: MetricCell | None, name: str, latex: bool = False) -> str:
    if cell is None:
        return "–"
    d = digits(name)
    pm = r" $\pm$ " if latex else " ± "
    text = f"{_num(cell.mean, d)}{pm}{_num(cell.std, d)}"
    if cell.tested:  # the figure's declaration asks for an interval (and a paired test) over cases
        text += f" [{_num(cell.ci95[0], d)}, {_num(cell.ci95[1], d)}]"
    if cell.p_vs_baseline is not None:
        text += f" ({_p(cell.p_vs_baseline)})" if not latex else f" ({_p(cell.p_vs_baseline).replace('<', '$<$')})"
    return text


def metric_columns(rows: list[ConfigRow]) -> list[str]:
    """The table's metric columns: ``metrics()`` that some evaluation scored (a figure of another kind of task,
    e.g. the binary-task nDSC on a multi-class dataset, has neither a value nor a case in any row and is left out),
    then ``RATER_METRICS`` when some row scored several raters."""
    def scored(name: str) -> bool:
        cells = [row.cells.get(name) for row in rows]
        return not cells or any(c is None or c.n_cases or not math.isnan(c.mean) for c in cells)

    return [m[0] for m in metrics() if scored(m[0])] + ([m[0] for m in RATER_METRICS] if any(r.raters for r in rows)
                                                        else [])


def row_cell(row: ConfigRow, name: str) -> MetricCell | None:
    """The row's cell of column ``name`` (:func:`metric_columns`); None where it was not measured."""
    return row.cells[name] if name in row.cells else row.raters.get(name)


def rater_lines(rows: list[ConfigRow]) -> list[str]:
    """What the columns and figures against several raters are, and which are against the single label;
    nothing when no row scored several raters."""
    if not any(r.raters for r in rows):
        return []
    return ["", "Several raters (docs/protocol.md, \"Several raters\"): Dice, HD95, ECE, CECE (and NLL, Brier and "
            "the failure detection columns of the predictor table) and the figures `reliability_selected*.png` and "
            "`reliability_histogram_selected*.png` are against each case's single label (`dataset.raters.target`, "
            "majority vote by default). Against the raters, raw outputs, cells as above: Dice vs raters (mean over "
            "raters of the Dice against each), consensus Dice (outside the raters' dissensus), thresholded Dice "
            "(QUBIQ: mean over t of Dice(p > t, m > t)), ECE and NLL vs rater mean (observed frequency m, the "
            "fraction of raters giving the class), ECE per rater (CURVAS: mean over raters of the ECE against "
            "each), volume CRPS (mL), GED and HM-IoU (only where the predictor has samples: ensembles, MC dropout, "
            "TTA; else –); rows without raters: –. "
            f"`{RATER_FIGURE}*.png`: per selected configuration, the top-label reliability against the rater mean "
            "(left) and against a single rater (right, the first rater, named in the title), pooled over cases "
            "and seeds (the evaluations' `reliability_raters.csv`)."]


def several_datasets(rows: list[ConfigRow]) -> bool:
    """Rows of more than one dataset: the tables then name each row's dataset."""
    return len({r.dataset for r in rows}) > 1


def markdown(rows: list[ConfigRow], title: str, protocol_lines: list[str]) -> str:
    names = metric_columns(rows)
    first = ("| dataset ", "|---") if several_datasets(rows) else ("", "")

    def table(selected_only: bool) -> list[str]:
        out = [first[0] + "| loss | hyperparameters | seeds | val. selection | T | "
               + " | ".join(headers()[n] for n in names) + " |",
               first[1] + "|---|---|---|---|---|" + "---|" * len(names)]
        for row in rows:
            if selected_only and not row.selected:
                continue
            mark = " (baseline)" if row.baseline else (" *" if row.selected and not selected_only else "")
            mark += ENVIRONMENT_MARK if row.environment_differs else ""
            mark += SEEN_MARK if row.seen_in_training else ""
            dataset = f"| {row.dataset} " if first[0] else ""
            out.append(f"{dataset}| {row.loss_name}{mark} | {row.hyperparameters} | {len(row.seeds)} | "
                       f"{_num(row.selection_value, 4)} | {_num(row.temperature, 2)} | "
                       + " | ".join(cell_text(row_cell(row, n), n) for n in names) + " |")
        return out

    lines = [f"# {title}", "", *protocol_lines, *rater_lines(rows), "",
             "## Selected configuration of each loss (by validation)"
             + (" on each dataset" if first[0] else ""), "", *table(True), "",
             "## All configurations (* = selected)", "", *table(False), "", *posthoc_table(rows),
             *predictor_table(rows), *shift_section(rows)]
    return "\n".join(lines)


def posthoc_table(rows: list[ConfigRow]) -> list[str]:
    """One pre_T row and one post_T row per post-hoc scaler of each selected configuration, each scaler
    labelled with how it was fitted (e.g. ``temperature (region, ece)``), with whether it changed the
    segmentation and by how much (``segmentation_cell``); nothing without scalers."""
    selected = [r for r in rows if r.selected and r.posthoc]
    if not selected:
        return []
    scored = set(metric_columns(rows))
    names = [m[0] for m in posthoc_metrics() if m[0] in scored]
    several = several_datasets(rows)
    out = ["## Post-hoc scalers of the selected configurations (fitted on the validation split)", "",
           ("| dataset " if several else "") + "| loss | hyperparameters | scaler (voxels, objective) | "
           + " | ".join(headers()[n].replace(" pre_T", "") for n in names) + " | segmentation |",
           ("|---" if several else "") + "|---|---|---|" + "---|" * (len(names) + 1)]
    for row in selected:
        head = (f"| {row.dataset} " if several else "") + f"| {row.loss_name} | {row.hyperparameters} | "
        out.append(head + "none (pre_T) | " + " | ".join(cell_text(row.cells.get(n), n) for n in names)
                   + " | raw |")
        for scaler, label in row.posthoc_labels.items():
            out.append(head + f"{label} | " + " | ".join(cell_text(row.posthoc[scaler].get(n), n) for n in names)
                       + f" | {row.posthoc_segmentation.get(scaler, '–')} |")
    return [*out, ""]


def mean_std_text(cell: tuple[float, float, int] | None, digits: int = 3) -> str:
    """``mean ± std`` of a (mean, std, n) cell over evaluations; the mean alone for one, '–' for none."""
    if cell is None:
        return "–"
    return _num(cell[0], digits) if cell[2] == 1 else f"{_num(cell[0], digits)} ± {_num(cell[1], digits)}"




def predictor_table(rows: list[ConfigRow]) -> list[str]:
    """Per configuration evaluated with more than its single networks: one row per predictor (mean ± std over
    its evaluations, n of them); AURC and E-AURC of the cases ranked by summed predictive entropy, UEO and
    the pooled voxel AUROC of the predictive entropy (docs/protocol.md); '–' where not measured."""
    selected = [r for r in rows if len(r.predictors) > 2]
    if not selected:
        return []
    several = several_datasets(rows)
    columns = {f.key: f.label for f in figures.shown_in("predictor")}
    if any(cells.get(c) for r in selected for cells in r.predictors.values() for c in RATER_PATHS):
        columns.update({c: RATER_HEADERS[c] for c in RATER_PATHS})  # against several raters (rater_lines)
    out = ["## Predictors of the configurations (single network, temperature, ensembles, TTA, MC dropout)",
           "", ("| dataset " if several else "") + "| loss | hyperparameters | predictor | n | "
           + " | ".join(columns.values()) + " |",
           ("|---" if several else "") + "|---|---|---|---|" + "---|" * len(columns)]
    for row in selected:
        for name, cells in row.predictors.items():
            n = max((c[2] for c in cells.values() if c), default=0)
            text = [mean_std_text(cells.get(column), digits(column)) for column in columns]
            out.append((f"| {row.dataset} " if several else "") + f"| {row.loss_name} | {row.hyperparameters} | "
                       f"{name} | {n} | " + " | ".join(text) + " |")
    return [*out, ""]


SHIFT_FIGURE = "shift_severity"


def _shift_rows(rows: list[ConfigRow], suite: str):
    """(row, predictor, ShiftCells) of every predictor of the rows evaluated under ``suite``."""
    return [(row, name, cells) for row in rows for name, cells in row.shift.get(suite, {}).items()]


def shift_section(rows: list[ConfigRow]) -> list[str]:
    """``## Under shift``: per suite and figure under shift (the table of figures' "shift"), one line per configuration and predictor
    evaluated under the suite (:mod:`mcseg.report.shift`); nothing when no run was evaluated under shift."""
    suites = list(dict.fromkeys(suite for row in rows for suite in row.shift))
    if not suites:
        return []
    several = several_datasets(rows)
    out = ["## Under shift", "",
           "Level s (0: clean): the mean over the suite's corruptions of the metric at that level, mean ± std over "
           "the predictor's evaluations under the suite (n: a configuration's seeds, an ensemble's evaluations); "
           "overall and degradation: ROOD-MRI's robustness scores (Boone et al. 2023) of each evaluation, over the "
           "levels shown with weights alpha^s (degradation > 0: worse under shift), mean ± std over the same "
           "evaluations. Only the corruptions and levels every evaluation of a predictor has are taken "
           "(docs/protocol.md, \"Evaluation under shift\"). "
           f"Figure: `{SHIFT_FIGURE}*.png` (the single networks' Dice and ECE by level, a box over corruptions).", ""]
    for suite in suites:
        found = _shift_rows(rows, suite)
        levels = sorted({s for _, _, cells in found for s in cells.levels})
        corruptions = list(dict.fromkeys(c for _, _, cells in found for c in cells.corruptions))
        alphas = ", ".join(f"{a:.4g}" for a in sorted({cells.alpha for _, _, cells in found}))
        out += [f"Suite `{suite}`: corruptions {', '.join(corruptions)}; alpha {alphas}.", ""]
        titles = {f.key: f.label for f in figures.table()}
        for metric in shift_metrics():
            title = titles[metric]
            have = [(row, name, cells) for row, name, cells in found if metric in cells.by_level]
            if not have:
                continue
            arrow = "higher is better" if have[0][2].higher_is_better[metric] else "lower is better"
            d = digits(metric)
            out += [f"### {suite}: {title} ({arrow})", "",
                    ("| dataset " if several else "") + "| loss | hyperparameters | predictor | n | corruptions | "
                    + " | ".join(f"level {s}" for s in levels) + " | overall | degradation |",
                    ("|---" if several else "") + "|---|---|---|---|---|" + "---|" * (len(levels) + 2)]
            for row, name, cells in have:
                scores = cells.scores[metric]
                out.append((f"| {row.dataset} " if several else "") + f"| {row.loss_name} | {row.hyperparameters} | "
                           f"{name} | {cells.n} | {len(cells.corruptions)} | "
                           + " | ".join(mean_std_text(cells.by_level[metric].get(s), d) for s in levels)
                           + f" | {mean_std_text(scores['overall'], d)} | {mean_std_text(scores['degradation'], d)} |")
            out.append("")
    return out


def write_shift_csv(rows: list[ConfigRow], path: Path) -> bool:
    """``shift.csv``: one line per configuration, suite, predictor, metric and level (the mean over corruptions,
    its mean, std and n over evaluations; the robustness scores repeated on each level's line); not written,
    and False returned, when no run was evaluated under shift."""
    columns = ["dataset", "loss", "hyperparameters", "configuration", "suite", "predictor", "metric",
               "higher_is_better", "level", "mean", "std", "n", "corruptions", "alpha", "overall_mean", "overall_std",
               "degradation_mean", "degradation_std"]
    lines = []
    for suite in dict.fromkeys(suite for row in rows for suite in row.shift):
        for row, name, cells in _shift_rows(rows, suite):
            for metric, by_level in cells.by_level.items():
                overall, degradation = cells.scores[metric]["overall"], cells.scores[metric]["degradation"]
                for level, cell in by_level.items():
                    lines.append({
                        "dataset": row.dataset, "loss": row.loss_name, "hyperparameters": row.hyperparameters,
                        "configuration": row.configuration, "suite": suite, "predictor": name, "metric": metric,
                        "higher_is_better": cells.higher_is_better[metric], "level": level,
                        "mean": cell and cell[0], "std": cell and cell[1], "n": cell[2] if cell else 0,
                        "corruptions": " ".join(cells.corruptions), "alpha": cells.alpha,
                        "overall_mean": overall and overall[0], "overall_std": overall and overall[1],
                        "degradation_mean": degradation and degradation[0],
                        "degradation_std": degradation and degradation[1]})
    if lines:
        write_csv(path, lines, columns)
    return bool(lines)


def write_report_csv(rows: list[ConfigRow], path: Path) -> None:
    """``report.csv``: one line per configuration, each figure's mean, std, 95% interval, cases and p-value."""
    header = ["dataset", "loss", "hyperparameters", "configuration", "seeds", "selection_value", "selected", "baseline",
               "temperature", "environment_differs", "scores_seen_cases"]
    names = metric_columns(rows)
    for name in names:
        header += [f"{name}_mean", f"{name}_std", f"{name}_ci95_lo", f"{name}_ci95_hi", f"{name}_n_cases",
                    f"{name}_p_vs_baseline"]
    records = []
    for row in rows:
        record = {"dataset": row.dataset, "loss": row.loss_name, "hyperparameters": row.hyperparameters, "configuration": row.configuration,
                  "seeds": " ".join(map(str, row.seeds)), "selection_value": row.selection_value,
                  "selected": row.selected, "baseline": row.baseline, "temperature": row.temperature,
                  "environment_differs": " ".join(row.environment_differs),
                  "scores_seen_cases": bool(row.seen_in_training)}
        for name in names:
            cell = row_cell(row, name)
            if cell is not None:
                record.update({f"{name}_mean": cell.mean, f"{name}_std": cell.std, f"{name}_ci95_lo": cell.ci95[0],
                               f"{name}_ci95_hi": cell.ci95[1], f"{name}_n_cases": cell.n_cases,
                               f"{name}_p_vs_baseline": cell.p_vs_baseline})
        records.append(record)
    write_csv(path, records, header)


def _tex_escape(text: str) -> str:
    for char in ("_", "%", "&", "#"):
        text = text.replace(char, "\\" + char)
    return text


def latex(rows: list[ConfigRow], caption: str) -> str:
    """A booktabs table of the selected configuration of each loss (mean ± std over seeds, [95% CI over cases])."""
    names = metric_columns(rows)
    lines = [r"\begin{table}[t]", r"\centering", r"\scriptsize", rf"\caption{{{_tex_escape(caption)}}}",
             r"\begin{tabular}{ll" + "c" * len(names) + "}", r"\toprule",
             "Loss & Hyperparameters & " + " & ".join(_tex_escape(headers()[n]) for n in names) + r" \\", r"\midrule"]
    for row in rows:
        if not row.selected:
            continue
        name = _tex_escape(row.loss_name) + (" (baseline)" if row.baseline else "") \
            + (r"$^\dagger$" if row.environment_differs else "")
        if several_datasets(rows):
            name = f"{_tex_escape(row.dataset)}: {name}"
        lines.append(f"{name} & {_tex_escape(row.hyperparameters)} & "
                     + " & ".join(cell_text(row_cell(row, n), n, latex=True) for n in names) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)

"""Report figures: reliability diagrams of the selected configurations overlaid, their dataset reliability
histograms, their reliability against the rater mean beside that against one rater, margin x lambda heatmaps,
risk-coverage curves, Dice and ECE by severity under shift."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from mcseg.report.table import ConfigRow


def pooled_reliability(run_dirs: list[Path], split: str, panel: str = "top-label",
                       file: str = "reliability.csv") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean confidence, accuracy, count) per bin of ``panel``, pooled over the runs' reliability.csv files (or
    ``file``s of its columns: reliability_raters.csv, its accuracy the observed frequency).

    Each file holds per-bin means and counts, so pooling weights every bin by its voxel count; a file without
    the panel adds nothing.
    """
    conf_sum = acc_sum = counts = None
    for run_dir in run_dirs:
        path = Path(run_dir) / "eval" / split / file
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["panel"] == panel]
        if not rows:
            continue
        n = np.asarray([float(r["count"]) for r in rows])
        conf = np.nan_to_num(np.asarray([float(r["mean_confidence"]) for r in rows]))
        acc = np.nan_to_num(np.asarray([float(r["accuracy"]) for r in rows]))
        if counts is None:
            conf_sum, acc_sum, counts = np.zeros_like(n), np.zeros_like(n), np.zeros_like(n)
        conf_sum, acc_sum, counts = conf_sum + conf * n, acc_sum + acc * n, counts + n
    if counts is None:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return conf_sum / counts, acc_sum / counts, counts


def reliability_overlay(rows: list[ConfigRow], split: str) -> Figure:
    """Top-label reliability curves (accuracy against confidence) of the selected configurations."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(5.5, 5))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
    for row in rows:
        if not row.selected:
            continue
        conf, acc, counts = pooled_reliability([r.path for r in row.runs], split)
        keep = counts > 0
        ece = row.cells["ece"].mean if row.cells.get("ece") else math.nan
        setting = "" if row.hyperparameters == "defaults" else f" {row.hyperparameters}"
        ax.plot(conf[keep], acc[keep], marker="o", markersize=3, label=f"{row.loss_name}{setting} (ECE {ece:.3f})")
    ax.set_xlabel("confidence (top-label, pooled over cases and seeds)")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"Reliability on the {split} split (selected configurations)", fontsize=9)
    fig.tight_layout()
    return fig


def first_rater(run_dirs: list[Path], split: str) -> str | None:
    """The first rater of the first of the runs' reliability_raters.csv files; None when none has one."""
    from mcseg.evaluation.raters import RELIABILITY_FILE

    for run_dir in run_dirs:
        path = Path(run_dir) / "eval" / split / RELIABILITY_FILE
        if path.is_file():
            with open(path, newline="") as f:
                return next((r["rater"] for r in csv.DictReader(f) if r["rater"]), None)
    return None


def reliability_raters(rows: list[ConfigRow], split: str) -> Figure | None:
    """Per selected configuration (as :func:`reliability_overlay`), its top-label reliability against the rater
    mean (left: observed frequency = mean fraction of raters giving the predicted class) beside that against a
    single rater (right: the first rater, named in the title), from the runs' reliability_raters.csv pooled over
    cases and seeds, with the ECE of the pooled bins; None when no selected run wrote one."""
    from mcseg.evaluation.raters import MEAN_PANEL, RELIABILITY_FILE, rater_panel

    shown = []
    for row in rows:
        paths = [r.path for r in row.runs]
        if row.selected and (rater := first_rater(paths, split)) is not None:
            shown.append((row, paths, rater))
    if not shown:
        return None
    from matplotlib.figure import Figure
    fig = Figure(figsize=(9, 4.2 * len(shown)))
    axes = np.asarray(fig.subplots(len(shown), 2, squeeze=False))
    for (row, paths, rater), pair in zip(shown, axes):
        setting = "" if row.hyperparameters == "defaults" else f" {row.hyperparameters}"
        for ax, panel, reference, observed in (
                (pair[0], MEAN_PANEL, "the rater mean", "mean fraction of raters giving the predicted class"),
                (pair[1], rater_panel(rater), f"rater {rater}", f"accuracy against rater {rater}")):
            conf, acc, counts = pooled_reliability(paths, split, panel, RELIABILITY_FILE)
            keep = counts > 0
            ece = float(np.abs(acc - conf)[keep] @ counts[keep] / counts.sum()) if keep.any() else math.nan
            ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
            ax.plot(conf[keep], acc[keep], marker="o", markersize=3, label=f"pooled ECE {ece:.3f}")
            ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top-label, pooled over cases and seeds)",
                   ylabel=observed)
            ax.legend(fontsize=7, loc="upper left")
            ax.set_title(f"{row.loss_name}{setting}: against {reference}", fontsize=9)
    fig.suptitle(f"Reliability against several raters on the {split} split (selected configurations)", fontsize=9)
    fig.tight_layout()
    return fig


def margin_heatmap(rows: list[ConfigRow], loss_name: str = "margin") -> Figure | None:
    """Test Dice and ECE over the margin x lambda grid of ``loss_name``'s configurations; None if < 2."""
    cells = {}
    for row in rows:
        if row.loss_name != loss_name:
            continue
        loss = row.runs[0].loss
        cells[(float(loss.get("margin", math.nan)), float(loss.get("alpha", math.nan)))] = row
    if len(cells) < 2:
        return None
    margins = sorted({m for m, _ in cells})
    alphas = sorted({a for _, a in cells})
    from matplotlib.figure import Figure
    fig = Figure(figsize=(4 + 1.2 * len(margins), 2.2 + 0.6 * len(alphas)), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, metric, title, cmap in ((axes[0], "dice", "test Dice", "viridis"), (axes[1], "ece", "test ECE", "magma_r")):
        grid = np.full((len(alphas), len(margins)), np.nan)
        for (m, a), row in cells.items():
            cell = row.cells.get(metric)
            grid[alphas.index(a), margins.index(m)] = cell.mean if cell else np.nan
        image = ax.imshow(grid, cmap=cmap, aspect="auto", origin="lower")
        for i in range(len(alphas)):
            for j in range(len(margins)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", fontsize=7,
                            bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 1})
        ax.set_xticks(range(len(margins)), [f"{m:g}" for m in margins])
        ax.set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        ax.set_xlabel("margin m")
        ax.set_ylabel("lambda (alpha)")
        ax.set_title(f"{loss_name}: {title} (mean over seeds)", fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046)
    return fig


def risk_coverage_overlay(rows: list[ConfigRow], split: str, key: str = "image_uncertainty/predictive_entropy"):
    """Selective risk (1 - Dice) against coverage of the selected configurations' single networks, the cases
    of every seed pooled and ranked by their summed predictive entropy (``failure_per_case.csv``; the curve of
    :func:`mcseg.metrics.risk_coverage.risk_coverage`); None when no evaluation wrote one."""
    from mcseg.metrics.risk_coverage import aurc, risk_coverage

    from matplotlib.figure import Figure
    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.subplots()
    drawn, risks = False, set()
    for row in rows:
        if not row.selected:
            continue
        confidence, risk, definitions = [], [], set()
        for run in row.runs:
            path = run.path / "eval" / split / "failure_per_case.csv"
            if not path.is_file():
                continue
            with open(path, newline="") as f:
                for r in csv.DictReader(f):
                    if r.get(key) not in (None, "") and r["risk"] not in ("", "nan"):
                        confidence.append(-float(r[key]))
                        risk.append(float(r["risk"]))
                        definitions.add(r.get("risk_definition") or "macro")  # older files: macro
        if not risk:
            continue
        curve = risk_coverage(confidence, risk)
        risks |= definitions
        setting = "" if row.hyperparameters == "defaults" else f" {row.hyperparameters}"
        ax.plot(curve["coverage"], curve["selective_risk"], drawstyle="steps-post",
                label=f"{row.loss_name}{setting} (AURC {aurc(confidence, risk):.3f})")
        drawn = True
    if not drawn:
        return None
    ax.set_xlabel("coverage (least certain cases left out first)")
    ax.set_ylabel(f"selective risk (1 - {' or '.join(sorted(risks))} foreground Dice)")
    ax.set_xlim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title(f"Risk-coverage on the {split} split (single networks, summed predictive entropy)", fontsize=9)
    fig.tight_layout()
    return fig


def pooled_histogram(run_dirs: list[Path], split: str) -> tuple[np.ndarray, list[str]] | None:
    """The dataset reliability histogram (P, M, M) summed over the runs' reliability_histogram.csv files
    (its cells count cases, so the cases of every run add up), with its panel names; None when none has one
    or they disagree on panels or bins (then none is drawn rather than a wrong sum)."""
    from mcseg.metrics.reliability import read_histogram_table

    total, names = None, None
    for run_dir in run_dirs:
        path = Path(run_dir) / "eval" / split / "reliability_histogram.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            hist, panels = read_histogram_table(csv.DictReader(f))
        if total is None:
            total, names = hist, panels
        elif panels != names or hist.shape != total.shape:
            return None
        else:
            total = total + hist
    return None if total is None else (total, names)


def reliability_histograms(rows: list[ConfigRow], split: str) -> Figure | None:
    """The dataset reliability histogram (Barfoot et al., MICCAI 2024) of each selected configuration, one
    row of panels per configuration (its classes, then their sum), the cases of every seed pooled; None
    when no selected run wrote one."""
    from mcseg.metrics.reliability import histogram_figure

    hists, names = [], []
    for row in rows:
        if not row.selected:
            continue
        pooled = pooled_histogram([r.path for r in row.runs], split)
        if pooled is None:
            continue
        hist, panels = pooled
        setting = "" if row.hyperparameters == "defaults" else f" {row.hyperparameters}"
        if len(panels) > 1:
            hist, panels = np.concatenate([hist, hist.sum(0, keepdims=True)]), [*panels, "all classes"]
        hists.append(hist)
        names += [f"{row.loss_name}{setting}: {p}" for p in panels]
    if not hists:
        return None
    width = len(hists[0])
    if any(len(h) != width or h.shape[1:] != hists[0].shape[1:] for h in hists):
        return None  # configurations of different classes or bins: no common grid
    return histogram_figure(np.concatenate(hists), names, total=None, max_columns=width,
                            title=f"Dataset reliability histograms on the {split} split (selected configurations, "
                                  "cases of every seed)")


SHIFT_FIGURE_ROWS = 6  # more configurations under a suite than this: the figure shows the selected ones
SHIFT_PANELS = (("single", "single networks"), ("single + T", "after temperature scaling"))


def shift_severity(rows: list[ConfigRow], suite: str, metrics=(("dice", "Dice"), ("ece", "ECE"))) -> Figure | None:
    """Each metric against the severity level under ``suite``, a box per configuration and level over the
    corruptions (each the mean over seeds, :class:`mcseg.report.shift.ShiftCells`), as Ovadia et al.
    (NeurIPS 2019, figure 2); one row of panels per metric, the single networks (left) and after temperature
    scaling (right), one colour per configuration: all configurations evaluated under the suite, or the selected
    ones when more than ``SHIFT_FIGURE_ROWS``. None when no single network was evaluated under it."""
    from matplotlib.patches import Patch

    shown = [r for r in rows if "single" in r.shift.get(suite, {})]
    if len(shown) > SHIFT_FIGURE_ROWS:
        shown = [r for r in shown if r.selected]
    panels = [(name, title) for name, title in SHIFT_PANELS if any(name in r.shift[suite] for r in shown)]
    if not shown or not panels:
        return None
    levels = sorted({s for r in shown for s in r.shift[suite]["single"].levels})
    width = 0.8 / len(shown)
    from matplotlib.figure import Figure
    fig = Figure(figsize=(4.5 * len(panels), 3.2 * len(metrics)), layout="constrained")
    axes = np.asarray(fig.subplots(len(metrics), len(panels), squeeze=False, sharey="row"))  # raw and T comparable
    for i, (metric, label) in enumerate(metrics):
        for j, (predictor, title) in enumerate(panels):
            ax = axes[i, j]
            for k, row in enumerate(shown):
                cells = row.shift[suite].get(predictor)
                if cells is None or metric not in cells.per_corruption:
                    continue
                boxes = [[v for c in cells.corruptions if (v := cells.per_corruption[metric][c].get(s)) is not None]
                         for s in levels]
                keep = [n for n, b in enumerate(boxes) if b]
                ax.boxplot([boxes[n] for n in keep], positions=[n + (k - (len(shown) - 1) / 2) * width for n in keep],
                           widths=width * 0.9, patch_artist=True, showfliers=True, manage_ticks=False,
                           boxprops={"facecolor": f"C{k}", "alpha": 0.7}, medianprops={"color": "black"},
                           flierprops={"markersize": 3})
            ax.set_xticks(range(len(levels)), [f"{s}{' (clean)' if s == 0 else ''}" for s in levels])
            ax.set_xlabel("severity level")
            ax.set_ylabel(label)
            ax.set_title(f"{label}, {title}", fontsize=9)
    handles = [Patch(facecolor=f"C{k}", alpha=0.7, label=f"{row.loss_name}"
                     + ("" if row.hyperparameters == "defaults" else f" {row.hyperparameters}"))
               for k, row in enumerate(shown)]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(3, len(handles)), fontsize=7)
    fig.suptitle(f"Under shift ({suite}): a box over corruptions per level, each corruption's mean over seeds",
                 fontsize=9)
    return fig

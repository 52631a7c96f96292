"""Reliability diagrams (DeGroot & Fienberg 1983; Guo et al., ICML 2017, fig. 1): per bin, the
accuracy against the mean confidence, with the bin counts below and the ECE in the title.

Built on :class:`~mcseg.metrics.binning.BinSums`, so the same code draws the top-label diagram
(sums of shape (M,)) and one panel per class (shape (K, M)). Figures are matplotlib ``Figure``
objects on the Agg canvas, without pyplot state, ready for ``SummaryWriter.add_figure``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mcseg.metrics.binning import BinSums

__all__ = ["TABLE_COLUMNS", "reliability_table", "reliability_figure"]

TABLE_COLUMNS = ("panel", "bin", "lo", "hi", "count", "mean_confidence", "accuracy", "gap")


def _panels(sums: BinSums, names: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    count, conf, correct = (t.detach().cpu().double().numpy().reshape(-1, t.shape[-1])
                            for t in (sums.count, sums.confidence, sums.correct))
    names = list(names) if names is not None else (["top_label"] if len(count) == 1 else
                                                   [f"class_{k}" for k in range(len(count))])
    if len(names) != len(count):
        raise ValueError(f"{len(names)} panel names for {len(count)} rows of bin sums")
    return count, conf, correct, names


def reliability_table(sums: BinSums, names: Sequence[str] | None = None) -> list[dict]:
    """One row per panel and bin: edges (lo, hi], count, mean confidence, accuracy and
    gap = accuracy - confidence (NaN for empty bins)."""
    count, conf, correct, names = _panels(sums, names)
    n_bins = count.shape[1]
    rows = []
    for name, n, c, a in zip(names, count, conf, correct):
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_conf, acc = np.where(n > 0, c / n, np.nan), np.where(n > 0, a / n, np.nan)
        rows += [{"panel": name, "bin": b, "lo": b / n_bins, "hi": (b + 1) / n_bins, "count": int(n[b]),
                  "mean_confidence": float(mean_conf[b]), "accuracy": float(acc[b]),
                  "gap": float(acc[b] - mean_conf[b])} for b in range(n_bins)]
    return rows


def reliability_figure(sums: BinSums, names: Sequence[str] | None = None, title: str = "",
                       max_columns: int = 4) -> Figure:
    """Reliability diagram(s): one panel per row of ``sums``, accuracy bars with the gap to
    the mean confidence, the diagonal, bin counts (log scale) below, ECE in each title."""
    count, conf, correct, names = _panels(sums, names)
    n_panels, n_bins = count.shape
    ncols = min(n_panels, max_columns)
    nrows = math.ceil(n_panels / ncols)
    width, height = 3.4 * ncols, 4.4 * nrows
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    # Margins fixed in inches: matplotlib's constrained layout measured every tick label of every
    # panel and took most of an evaluation's time on small volumes (0.5-1 s per figure).
    grid = fig.add_gridspec(nrows, ncols, left=0.75 / width, right=1 - 0.15 / width, bottom=0.6 / height,
                            top=1 - (0.75 if title else 0.4) / height, wspace=0.45, hspace=0.3)
    centres = (np.arange(n_bins) + 0.5) / n_bins
    for i, (name, n, c, a) in enumerate(zip(names, count, conf, correct)):
        top, bottom = grid[i // ncols, i % ncols].subgridspec(2, 1, height_ratios=(3, 1), hspace=0.12).subplots(
            sharex=True)
        filled = n > 0
        acc = np.divide(a, n, out=np.zeros_like(a), where=filled)
        mean_conf = np.divide(c, n, out=np.zeros_like(c), where=filled)
        ece = np.abs(a - c).sum() / n.sum() if n.sum() > 0 else math.nan
        top.bar(centres[filled], acc[filled], width=1.0 / n_bins, color="tab:blue", edgecolor="black",
                linewidth=0.5, label="accuracy")
        top.bar(centres[filled], (mean_conf - acc)[filled], bottom=acc[filled], width=1.0 / n_bins,
                color="tab:red", alpha=0.3, edgecolor="tab:red", hatch="//", linewidth=0.5, label="gap to confidence")
        top.plot([0, 1], [0, 1], "k--", linewidth=1)
        top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", title=f"{name}  ECE = {ece:.4f}")
        top.legend(loc="upper left", fontsize="small")
        bottom.bar(centres, np.maximum(n, 0), width=1.0 / n_bins, color="gray", edgecolor="black", linewidth=0.5)
        if n.max() > 0:
            bottom.set_yscale("log")
        bottom.set(xlabel="confidence", ylabel="voxels")
    if title:
        fig.suptitle(title)
    return fig

"""Reliability diagrams (DeGroot & Fienberg 1983; Guo et al., ICML 2017, fig. 1): per bin, the
accuracy against the mean confidence, with the bin counts below and the ECE in the title.

Built on :class:`~mcseg.metrics.binning.BinSums`, so the same code draws the top-label diagram
(sums of shape (M,)) and one panel per class (shape (K, M)). Figures are matplotlib ``Figure``
objects on the Agg canvas, without pyplot state, ready for ``SummaryWriter.add_figure``.

The dataset reliability histogram (Barfoot et al., MICCAI 2024, the mL1-ACE paper; their
``calculate_heatmap_from_bins``) shows how the per-case diagrams spread, which a pooled diagram
hides: per class, for every case and every non-empty confidence bin k of that case's classwise
diagram (bins over p_c), the case's observed frequency acc_k = correct_k / n_k is put into one of
the same M equal-width bins (lo, hi], and the cell (frequency bin, k) counts the cases. Empty bins
of a case add nothing. Its cells are sums over cases, so cases, splits and seeds pool by addition.
(The x axis is the confidence bin itself; a case's mean confidence in bin k lies in bin k.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from mcseg.metrics.binning import BinSums, bin_index

__all__ = ["HISTOGRAM_COLUMNS", "TABLE_COLUMNS", "case_histogram", "histogram_figure", "histogram_table",
           "read_histogram_table", "reliability_table", "reliability_figure"]

TABLE_COLUMNS = ("panel", "bin", "lo", "hi", "count", "mean_confidence", "accuracy", "gap")
HISTOGRAM_COLUMNS = ("panel", "confidence_bin", "confidence_lo", "confidence_hi", "frequency_bin", "frequency_lo",
                     "frequency_hi", "cases")


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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
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


# ---------------------------------------------------------------- dataset reliability histogram
def case_histogram(sums: BinSums) -> np.ndarray:
    """One case's cells of the dataset reliability histogram: ``sums`` of shape (P, M) (one panel per
    class: the case's classwise bin sums) give an int64 array (P, M, M) indexed [panel, frequency
    bin, confidence bin], 1 where the case's confidence bin is non-empty and its observed frequency
    falls into that frequency bin, 0 elsewhere."""
    count = sums.count.detach().double().reshape(-1, sums.count.shape[-1]).cpu()
    correct = sums.correct.detach().double().reshape(count.shape).cpu()
    n_panels, n_bins = count.shape
    panel, conf_bin = (count > 0).nonzero(as_tuple=True)
    freq_bin = bin_index(correct[panel, conf_bin] / count[panel, conf_bin], n_bins)
    cells = torch.bincount((panel * n_bins + freq_bin) * n_bins + conf_bin, minlength=n_panels * n_bins * n_bins)
    return cells.view(n_panels, n_bins, n_bins).numpy().astype(np.int64)


def histogram_table(hist: np.ndarray, names: Sequence[str]) -> list[dict]:
    """One row per panel, confidence bin and frequency bin (edges (lo, hi]) with its number of cases."""
    hist = np.asarray(hist)
    if hist.ndim != 3 or hist.shape[1] != hist.shape[2] or len(names) != len(hist):
        raise ValueError(f"histogram of shape {hist.shape} for {len(names)} panel names: expected (P, M, M)")
    m = hist.shape[1]
    return [{"panel": name, "confidence_bin": k, "confidence_lo": k / m, "confidence_hi": (k + 1) / m,
             "frequency_bin": r, "frequency_lo": r / m, "frequency_hi": (r + 1) / m, "cases": int(h[r, k])}
            for name, h in zip(names, hist) for k in range(m) for r in range(m)]


def read_histogram_table(rows) -> tuple[np.ndarray, list[str]]:
    """The (P, M, M) histogram and panel names of :func:`histogram_table` rows (e.g. read from its CSV)."""
    rows = list(rows)
    names = list(dict.fromkeys(r["panel"] for r in rows))
    m = max(int(r["confidence_bin"]) for r in rows) + 1 if rows else 0
    hist = np.zeros((len(names), m, m), dtype=np.int64)
    for r in rows:
        hist[names.index(r["panel"]), int(r["frequency_bin"]), int(r["confidence_bin"])] += int(r["cases"])
    return hist, names


def histogram_figure(hist: np.ndarray, names: Sequence[str], title: str = "", voxels: np.ndarray | None = None,
                     total: str | None = "all classes", max_columns: int = 4) -> Figure:
    """The dataset reliability histogram: per panel a 2D histogram of confidence bin (x) against
    observed frequency (y), the colour the number of cases (YlOrRd, power norm gamma 0.35 and 20
    bins in the authors' plots; empty cells white), the diagonal; ``total``: a further panel of
    that name, the sum over panels (the authors' "average"); ``voxels`` (P, M): the pooled voxel
    counts per confidence bin, drawn below each panel (log scale)."""
    hist = np.asarray(hist, dtype=np.int64)
    names = list(names)
    if hist.ndim != 3 or hist.shape[1] != hist.shape[2] or len(names) != len(hist):
        raise ValueError(f"histogram of shape {hist.shape} for {len(names)} panel names: expected (P, M, M)")
    if voxels is not None:
        voxels = np.asarray(voxels, dtype=np.float64).reshape(len(hist), -1)
    if total is not None and len(hist) > 1:
        hist, names = np.concatenate([hist, hist.sum(0, keepdims=True)]), [*names, total]
        voxels = None if voxels is None else np.concatenate([voxels, voxels.sum(0, keepdims=True)])
    n_panels = len(hist)
    ncols = max(1, min(n_panels, max_columns))
    nrows = max(1, math.ceil(n_panels / ncols))
    width, height = 3.6 * ncols, (4.4 if voxels is not None else 3.4) * nrows
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, NullFormatter
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(nrows, ncols, left=0.75 / width, right=1 - 0.45 / width, bottom=0.6 / height,
                            top=1 - (0.75 if title else 0.4) / height, wspace=0.55, hspace=0.35)
    n_bins = hist.shape[1] if hist.size else 1
    centres = (np.arange(n_bins) + 0.5) / n_bins
    cmap = _colour_map()
    for i, (name, h) in enumerate(zip(names, hist)):
        cell = grid[i // ncols, i % ncols]
        if voxels is not None:
            top, bottom = cell.subgridspec(2, 1, height_ratios=(3, 1), hspace=0.12).subplots(sharex=True)
        else:
            top, bottom = fig.add_subplot(cell), None
        image = top.imshow(np.ma.masked_equal(h, 0), origin="lower", extent=(0, 1, 0, 1), aspect="auto", cmap=cmap,
                           norm=PowerNorm(gamma=0.35, vmin=0, vmax=max(1, int(h.max()))), interpolation="nearest")
        top.plot([0, 1], [0, 1], "k--", linewidth=1)
        top.set(xlim=(0, 1), ylim=(0, 1), ylabel="observed frequency", title=f"{name}")
        bar = fig.colorbar(image, ax=top if bottom is None else [top, bottom], fraction=0.05, pad=0.03)
        bar.set_label("cases", fontsize="small")
        bar.locator = MaxNLocator(integer=True)  # a number of cases per panel, its own scale
        bar.update_ticks()
        if bottom is None:
            top.set_xlabel("confidence")
            continue
        n = voxels[i]
        bottom.bar(centres, np.maximum(n, 0), width=1.0 / n_bins, color="gray", edgecolor="black", linewidth=0.5)
        if n.max() > 0:
            bottom.set_yscale("log")
            bottom.yaxis.set_minor_formatter(NullFormatter())
        bottom.set(xlabel="confidence", ylabel="voxels")
    if title:
        fig.suptitle(title)
    return fig


def _colour_map():
    from matplotlib import colormaps

    return colormaps["YlOrRd"].with_extremes(bad="white")

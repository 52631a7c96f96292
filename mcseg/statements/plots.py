"""The statements of a set of new cases at a glance (a matplotlib ``Figure`` on the Agg canvas, without pyplot
state, ready for a tracker's ``add_figure``): one panel per structure, the cases sorted by their mask volume, each
case's volume interval in mL as a bar around its mask volume (flagged cases in red), and the true volume as a black
dot where the cases' labels were given to measure; the title names the level, n and the share covered."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["statements_figure"]


def statements_figure(rows: list[dict], level: float, n_calibration: int) -> Figure:
    structures = list(dict.fromkeys(r["structure"] for r in rows))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(4.5 * len(structures), 3.6), constrained_layout=True)
    FigureCanvasAgg(fig)
    for i, structure in enumerate(structures):
        ax = fig.add_subplot(1, len(structures), i + 1)
        own = sorted((r for r in rows if r["structure"] == structure), key=lambda r: r["volume_mask_ml"])
        x = np.arange(len(own))
        centre = np.array([r["volume_mask_ml"] for r in own])
        lower = np.array([r["volume_lower_ml"] for r in own])
        upper = np.array([r["volume_upper_ml"] for r in own])
        finite = np.isfinite(upper)
        colours = ["tab:red" if r["review"] else "tab:blue" for r in own]
        for j in np.nonzero(finite)[0]:
            ax.plot([x[j], x[j]], [lower[j], upper[j]], color=colours[j], linewidth=2, alpha=0.7)
        ax.scatter(x, centre, c=colours, s=12, zorder=3, label="mask volume")
        title = f"{structure}: volume at {level:.0%}"
        if "volume_true_ml" in own[0]:
            ax.scatter(x, [r["volume_true_ml"] for r in own], c="black", s=8, zorder=4, label="true volume")
            title += f", {np.mean([r['volume_covered'] for r in own]):.0%} covered"
        if not finite.all():
            title += f" ({int((~finite).sum())} infinite)"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"new cases, by mask volume (red: flagged); n = {n_calibration} calibration", fontsize=8)
        ax.set_ylabel("mL")
        ax.legend(fontsize=7, loc="upper left")
    return fig

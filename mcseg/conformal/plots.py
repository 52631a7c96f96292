"""Figures of conformal sets a person reads at a glance (matplotlib ``Figure`` objects on the Agg canvas, without
pyplot state, ready for ``SummaryWriter.add_figure`` as the reliability diagrams are):

* :func:`overlay_figure`: one case, one panel per class, on the slice where the class's predicted structure is
  largest: the image (or the class's probability where no image is given) in grey, the "sure" mask filled green,
  the predicted structure outlined blue, the "possible" mask outlined orange, the ground truth dashed white.
* :func:`coverage_figure`: over random calibration / test splits, the mean test risk against alpha (it must stay
  on or below the diagonal for CRC) and the margins' coverage against 1 - alpha, with +-2 standard errors.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["case_overlay", "coverage_figure", "largest_slice", "overlay_figure"]

COLOURS = {"prediction": "tab:blue", "possible": "tab:orange", "sure": "tab:green", "truth": "white"}


def largest_slice(mask: np.ndarray, axis: int) -> int:
    """The slice along ``axis`` with the most voxels of ``mask`` (the middle one for an empty mask)."""
    counts = np.asarray(mask, bool).sum(axis=tuple(a for a in range(mask.ndim) if a != axis))
    return int(counts.argmax()) if counts.any() else mask.shape[axis] // 2


def _outline(ax, mask: np.ndarray, colour: str, style: str = "solid") -> None:
    if mask.any() and not mask.all():
        ax.contour(mask.T.astype(float), levels=[0.5], colors=[colour], linewidths=1.2, linestyles=style,
                   origin="lower")


def overlay_figure(background: np.ndarray | Sequence[np.ndarray], masks: dict[str, dict[str, np.ndarray]],
                   truth: dict[str, np.ndarray] | None = None, title: str = "", axis: int = -1) -> Figure:
    """One panel per class of ``masks`` (``{class: {"prediction", "sure", "possible": *S booleans}}``) on its
    largest predicted slice along ``axis``; ``background``: one ``*S`` image for every panel, or one per class;
    ``truth``: ``{class: *S boolean}`` drawn dashed where given."""
    names = list(masks)
    width = 3.2 * len(names)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    fig = Figure(figsize=(width, 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for i, (ax, name) in enumerate(zip(axes, names)):
        image = background[i] if isinstance(background, (list, tuple)) else background
        ndim = np.ndim(image)
        where = axis % ndim
        index = largest_slice(masks[name]["prediction"], where)

        def cut(volume: np.ndarray) -> np.ndarray:
            return np.take(np.asarray(volume), index, axis=where) if ndim == 3 else np.asarray(volume)

        ax.imshow(cut(image).T, cmap="gray", origin="lower", interpolation="nearest")
        sure = cut(masks[name]["sure"])
        ax.imshow(np.ma.masked_where(~sure.T, sure.T), cmap="Greens", vmin=0, vmax=1.5, alpha=0.6,
                  origin="lower", interpolation="nearest")
        _outline(ax, cut(masks[name]["prediction"]), COLOURS["prediction"])
        _outline(ax, cut(masks[name]["possible"]), COLOURS["possible"])
        if truth is not None and name in truth:
            _outline(ax, cut(truth[name]), COLOURS["truth"], "dashed")
        ax.set_title(f"{name} (slice {index})" if ndim == 3 else name, fontsize="small")
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [Line2D([], [], color=COLOURS[k], linestyle="dashed" if k == "truth" else "solid", label=k)
               for k in ("prediction", "possible", "sure", *(["truth"] if truth else []))]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize="small", facecolor="lightgray")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.12, top=0.85 if title else 0.92, wspace=0.05)
    return fig


def coverage_figure(rows: Sequence[dict], title: str = "") -> Figure:
    """From validity rows (:func:`mcseg.conformal.validity.validity_rows`, several alphas): per class the mean
    test risk against alpha, and the mean coverage of the grown and shrunk masks against 1 - alpha."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8.0, 3.8))
    FigureCanvasAgg(fig)
    risk_ax, cover_ax = fig.subplots(1, 2)
    alphas = sorted({float(r["alpha"]) for r in rows})
    line = [min(alphas) * 0.8, max(alphas) * 1.1]
    risk_ax.plot(line, line, "k--", linewidth=1, label="alpha")
    cover_ax.plot([1 - a for a in line], [1 - a for a in line], "k--", linewidth=1, label="1 - alpha")
    for name in dict.fromkeys(r["class"] for r in rows):
        mine = sorted((r for r in rows if r["class"] == name), key=lambda r: float(r["alpha"]))
        a = np.array([float(r["alpha"]) for r in mine])

        def column(key: str) -> tuple[np.ndarray, np.ndarray]:
            values = np.array([float(r[key]) for r in mine])
            spread = np.array([float(r.get(f"{key}_se") or 0.0) for r in mine])
            return values, 2 * np.nan_to_num(spread)

        risk, spread = column("mean_test_risk")
        risk_ax.errorbar(a, risk, yerr=spread, marker="o", capsize=3, label=name)
        covered, spread = column("mean_covered")
        cover_ax.errorbar(1 - a, covered, yerr=spread, marker="o", capsize=3, label=f"{name} possible")
        inside, spread = column("mean_sure_inside")
        cover_ax.errorbar(1 - a, inside, yerr=spread, marker="s", linestyle=":", capsize=3, label=f"{name} sure")
    risk_ax.set(xlabel="alpha", ylabel="mean test risk over splits", title="risk control")
    cover_ax.set(xlabel="1 - alpha", ylabel="fraction of test cases", title="margins")
    risk_ax.legend(fontsize="small")
    cover_ax.legend(fontsize="x-small")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.14, top=0.82 if title else 0.9, wspace=0.3)
    return fig


def case_overlay(path, case: str, probs, sets: dict, pred: np.ndarray, truth: np.ndarray | None, names: list[str],
                 image: np.ndarray | None = None) -> Figure:
    """:func:`overlay_figure` of one case's sets (:func:`mcseg.conformal.fit.case_sets`) saved as PNG at ``path``:
    beneath, ``image`` or else (no image at hand) each class's probability, the title says which; the truth where
    there is a label. Returns the figure (for the trackers' image logging)."""
    from mcseg.files import atomic_write

    masks = {names[k]: {"prediction": pred[k], **{kind: m[kind] for kind in ("sure", "possible")}}
             for k, m in sets.items()}
    background = image if image is not None else [np.asarray(probs[k]) for k in sets]
    beneath = "over the image" if image is not None else "over each class's probability"
    fig = overlay_figure(background, masks, {names[k]: truth[k] for k in sets} if truth is not None else None,
                         title=f"{case} ({beneath})")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    return fig

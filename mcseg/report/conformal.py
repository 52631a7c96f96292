"""``## Conformal guarantees`` of mcseg-report: per run whose evaluation ran the conformal pass (its summary.json
has a ``conformal`` block; docs/conformal.md), per source (raw, each post-hoc scaler) and class the fitted
threshold, whether it is controlled, the test loss against alpha, the set's volume relative to the prediction, the
margins in mm and n calibration cases, read from ``<eval dir>/conformal/<source>/conformal.json``, and links to
its overlay figures (``conformal.figures``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from mcseg.report.collect import RunRecord

__all__ = ["conformal_section"]


def _records(run: RunRecord, split: str) -> dict[str, tuple[Path, dict]]:
    """Per source of the run's conformal block: its folder and conformal.json (those that are missing left out)."""
    folder = run.path / "eval" / split / "conformal"
    found = {}
    for source in run.summaries.get("", {}).get("conformal", {}):
        path = folder / source / "conformal.json"
        if path.is_file():
            found[source] = (path.parent, json.loads(path.read_text()))
    return found


def _number(value, digits: str = ".3g") -> str:
    return "–" if value is None else format(value, digits)


def _class_line(run: RunRecord, source: str, name: str, record: dict) -> str:
    fit, test = record["classes"][name], (record.get("test") or {}).get(name) or {}
    return (f"| {run.path.name} | {source} | {name} | {_number(fit['threshold'])} | "
            f"{'yes' if fit['controlled'] else 'NO'} | {_number(test.get('mean_loss'), '.3f')} / {record['alpha']:g} | "
            f"{_number(test.get('mean_set_over_prediction'), '.3f')} | {_number(fit['margin']['outer_mm'])} | "
            f"{_number(fit['margin']['inner_mm'])} | {fit['n_cases']} |")


def conformal_section(runs: list[RunRecord], split: str, out: Path) -> list[str]:
    """The section's lines (nothing when no run's evaluation has a conformal block); figure links relative to the
    report's folder ``out``."""
    found = [(run, _records(run, split)) for run in runs]
    found = [(run, records) for run, records in found if records]
    if not found:
        return []
    lines = ["## Conformal guarantees", "",
             "Per run, source of the probabilities (raw or after a post-hoc scaler) and class: the threshold fitted "
             "on the run's validation cases, whether the bound holds there, the mean test loss (FNR, or FDR) against "
             "alpha, the mean set volume over the predicted volume, the outer and inner margins in mm (their "
             "quantile at 1 - alpha) and n calibration cases with the class. Cases, not voxels, are the units "
             "(docs/conformal.md).", "",
             "| run | source | class | threshold | controlled | test loss / alpha | set / prediction | outer mm | "
             "inner mm | n |", "|---|---|---|---|---|---|---|---|---|---|"]
    figures = []
    for run, records in found:
        for source, (folder, record) in records.items():
            lines += [_class_line(run, source, name, record) for name in record["classes"]]
            figures += [f"[{run.path.name} {source} {Path(f).stem}]({os.path.relpath(folder / f, out)})"
                        for f in record["applied"]["files"] if f.endswith(".png")]
    if figures:
        lines += ["", "Overlays (image or probability, prediction blue, \"possible\" orange, \"sure\" green, truth "
                      "dashed): " + ", ".join(figures)]
    return [*lines, ""]

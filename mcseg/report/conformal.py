"""``## Conformal guarantees`` of mcseg-report (docs/conformal.md): every conformal fit found
(:func:`collect_conformal`) per source of the probabilities and class: the fitted threshold, whether it is controlled, the test loss against
alpha, the set's volume relative to the prediction, the margins in mm and n calibration cases, links to its overlay
figures; and where the fit's calibration and test cases were split again at random (conformal.json's ``validity``:
``conformal.repeats``, ``mcseg-conformal-folder --repeats``), its coverage figure and, per class at the fit's
alpha, the mean test risk and the violation rate over the splits with their standard errors.

The fits are read from ``conformal.json``: of a run's evaluation (``<run>/eval/<split>/conformal/<source>/``, and
of its TTA or MC-dropout variants ``<run>/eval/<split>-<tag>/conformal/<source>/``) and of an ensemble's
(``<dir>/ensembles/<name>/<split>[-<tag>]/conformal/<source>/``), for the sources their summary.json's ``conformal``
block names; and of ``mcseg-conformal-folder`` output folders under the report's directories (a directory may be
one), completed ones only."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mcseg.conformal.record import CONFORMAL_FILE
from mcseg.report.collect import EnsembleRecord, RunRecord

__all__ = ["ConformalFit", "collect_conformal", "conformal_section", "folder_fit", "folder_fits", "tool_records"]

log = logging.getLogger(__name__)


@dataclass
class ConformalFit:
    """One conformal fit as the report shows it: who made it (``label``: a run, a variant of it, an ensemble, a
    folder), the probabilities it was fitted on (``source``: raw, a post-hoc scaler, saved files), its folder and
    its conformal.json."""

    label: str
    source: str
    folder: Path
    record: dict


def _of_evaluation(label: str, folder: Path, block: dict | None) -> list[ConformalFit]:
    """Per source of an evaluation's summary.json ``conformal`` block, its ``folder/<source>/conformal.json``
    (those that are missing left out)."""
    found = []
    for source in block or {}:
        path = folder / source / CONFORMAL_FILE
        if path.is_file():
            found.append(ConformalFit(label, source, path.parent, json.loads(path.read_text())))
    return found


def tool_records(roots: list[Path], file_name: str, tool: str) -> list[tuple[Path, dict]]:
    """``(folder, record)`` of every ``file_name`` under ``roots`` (or ``roots`` themselves) that ``tool`` wrote
    (its ``tool`` key) in a completed folder (others warned about and left out)."""
    from mcseg.evaluation.folder_outputs import folder_status

    found = []
    for path in sorted({p.resolve() for root in roots for p in Path(root).glob(f"**/{file_name}")}):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            log.warning("%s: unreadable JSON (%s); ignored", path, exc)
            continue
        if not isinstance(record, dict) or record.get("tool") != tool:
            continue  # a checkpoint evaluation's: found through its run or ensemble
        status = folder_status(path.parent)
        if status is not None and status["status"] != "completed":
            log.warning("%s: %s is %s; not reported (run its command again)", path.parent, tool, status["status"])
            continue
        found.append((path.parent, record))
    return found


def folder_fits(roots: list[Path]) -> list[ConformalFit]:
    """The completed ``mcseg-conformal-folder`` outputs under ``roots`` (or ``roots`` themselves), labelled by the
    folder's last two path parts; the source names the saved files' tool (and whether they were calibrated)."""
    from mcseg.evaluation.folder_outputs import CONFORMAL_TOOL

    return [folder_fit(folder, record) for folder, record in tool_records(roots, CONFORMAL_FILE, CONFORMAL_TOOL)]


def folder_fit(folder: Path, record: dict) -> ConformalFit:
    """An ``mcseg-conformal-folder`` output as the report shows it: labelled by the folder's last two path parts,
    its source the saved files' tool (and whether they were calibrated)."""
    predictions = (record.get("provenance") or {}).get("predictions") or []
    tools = "+".join(dict.fromkeys(str(p.get("tool")) for p in predictions)) or "?"
    calibrated = any(p.get("calibration") for p in predictions)
    return ConformalFit("/".join(Path(folder).parts[-2:]), f"saved {tools}{' calibrated' if calibrated else ''}",
                        Path(folder), record)


def collect_conformal(runs: list[RunRecord], ensembles: list[EnsembleRecord], roots: list[Path],
                      split: str) -> list[ConformalFit]:
    """Every conformal fit of the report (module docstring): runs, their variants, ensembles, then folders."""
    found = []
    for run in runs:
        evaluations = run.path / "eval"
        found += _of_evaluation(run.path.name, evaluations / split / "conformal",
                                run.summaries.get("", {}).get("conformal"))
        for tag, summary in run.variants.items():
            found += _of_evaluation(f"{run.path.name} ({tag})", evaluations / f"{split}-{tag}" / "conformal",
                                    summary.get("conformal"))
    for ensemble in ensembles:
        label = f"ensemble {ensemble.path.parent.name}" + (f" ({ensemble.tag})" if ensemble.tag else "")
        found += _of_evaluation(label, ensemble.path / "conformal", ensemble.summary.get("conformal"))
    return found + folder_fits(roots)


def _number(value, digits: str = ".3g") -> str:
    return "–" if value is None else format(value, digits)


def _class_line(fit: ConformalFit, name: str) -> str:
    record = fit.record
    fitted, test = record["classes"][name], (record.get("test") or {}).get(name) or {}
    return (f"| {fit.label} | {fit.source} | {name} | {_number(fitted['threshold'])} | "
            f"{'yes' if fitted['controlled'] else 'NO'} | {_number(test.get('mean_loss'), '.3f')} / "
            f"{record['alpha']:g} | {_number(test.get('mean_set_over_prediction'), '.3f')} | "
            f"{_number(fitted['margin']['outer_mm'])} | {_number(fitted['margin']['inner_mm'])} | "
            f"{fitted['n_cases']} |")


def _spread(mean, se) -> str:
    return f"{_number(mean, '.3f')} ± {_number(se, '.3f')}"


def validity_lines(fit: ConformalFit, out: Path) -> list[str]:
    """The coverage figure of a fit's re-splits and per class, at the fit's alpha, the mean test risk and the
    violation rate over the splits (against delta for RCPS and LTT, which bound it; CRC bounds the mean)."""
    record, validity = fit.record, fit.record["validity"]
    alpha, loss, method = float(record["alpha"]), record["loss"].upper(), record["method"]
    promise = (f"at most delta = {record['delta']:g} promised" if method in ("rcps", "ltt") else
               "CRC bounds the mean, not this")
    figure = os.path.relpath(fit.folder / next(f for f in validity["files"] if f.endswith(".png")), out)
    lines = [f"**{fit.label}, {fit.source}** ({method.upper()} of the {loss}; {validity['n_cases']} cases, "
             f"{validity['n_calibration']} to calibrate, {validity['repeats']} splits): "
             f"![coverage {fit.label} {fit.source}]({figure})", ""]
    for row in validity["rows"]:
        if float(row["alpha"]) != alpha:
            continue
        uncontrolled = f"; not controlled in {row['uncontrolled_splits']} splits" if row["uncontrolled_splits"] else ""
        lines.append(f"- {row['class']}: mean test {loss} {_spread(row['mean_test_risk'], row['mean_test_risk_se'])}"
                     f" (alpha = {alpha:g}); test {loss} > alpha in "
                     f"{_spread(row['violation_rate'], row['violation_rate_se'])} of the splits ({promise})"
                     f"{uncontrolled}")
    return [*lines, ""]


def conformal_section(fits: list[ConformalFit], out: Path) -> list[str]:
    """The section's lines (nothing without a fit); figure links relative to the report's folder ``out``."""
    if not fits:
        return []
    lines = ["## Conformal guarantees", "",
             "Per run (or variant, ensemble, mcseg-conformal-folder output), source of the probabilities (raw, "
             "after a post-hoc scaler, or the saved files) and class: the threshold fitted on the calibration "
             "cases (a run's validation cases), whether the bound holds there, the mean test loss (FNR, or FDR) "
             "against alpha, the mean set volume over the predicted volume, the outer and inner margins in mm "
             "(their quantile at 1 - alpha) and n calibration cases with the class. Cases, not voxels, are the "
             "units (docs/conformal.md). –: not computed (no finite margin when alpha < 1/(n+1) or a calibration "
             "case has an empty prediction; no test case with the class).", "",
             "| run | source | class | threshold | controlled | test loss / alpha | set / prediction | outer mm | "
             "inner mm | n |", "|---|---|---|---|---|---|---|---|---|---|"]
    figures = []
    for fit in fits:
        lines += [_class_line(fit, name) for name in fit.record["classes"]]
        figures += [f"[{fit.label} {fit.source} {Path(f).stem}]({os.path.relpath(fit.folder / f, out)})"
                    for f in (fit.record.get("applied") or {}).get("files") or [] if f.endswith(".png")]
    if figures:
        lines += ["", "Overlays (image or probability, prediction blue, \"possible\" orange, \"sure\" green, truth "
                      "dashed): " + ", ".join(figures)]
    split_again = [fit for fit in fits if fit.record.get("validity")]
    if split_again:
        lines += ["", "### Over random re-splits", "",
                  "Each fit's calibration and test cases pooled and split again at random, as many calibration "
                  "cases as the fit had (conformal.json `validity`, `validity.csv`): the figure gives per class the "
                  "mean test risk against alpha and the margins' coverage against 1 - alpha (±2 standard errors); "
                  "the lines the mean test risk and the violation rate at the fit's alpha, ± their standard errors. "
                  "Splits of one pool are dependent repeats: a sanity check, not an exact test; the guarantee is "
                  "the fixed split's (the table above).", ""]
        for fit in split_again:
            lines += validity_lines(fit, out)
    return [*lines, ""]

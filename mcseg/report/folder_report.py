"""``report.html`` (and its text, ``report.md``) of a folder command's output: ``mcseg-calibrate-folder``,
``mcseg-conformal-folder`` or ``mcseg-new-cases``, written by the command itself at its end and by ``mcseg-report
FOLDER``. One self-contained page as :mod:`mcseg.report.html` writes them (inline style, script, figures; nothing
fetched), holding:

* a header naming the command, the fit and applied folders, the reference and the versions recorded;
* calibration: per fitted scaler its parameters and the NLL before -> after on its fit voxels (calibration.json),
  and on the labelled calibrated cases the ECE and NLL before and after, over the fit's calibration region
  (equal-width bins, top-label), with an SVG reliability diagram before and after whose bins give their voxel count
  on hover (:func:`mcseg.report.folder_cases.calibration_stats`);
* conformal: the section of report.md (:func:`mcseg.report.conformal.conformal_section`): per class the threshold,
  test loss against alpha, margins, and the coverage figure against alpha of the re-splits;
* statements: the per-case QC table, flagged cases first (:func:`mcseg.report.statements.qc_lines`: volume with
  its interval, Dice lower bound, HD95 upper bound, review flag), and the statements figure (intervals per case,
  true volumes and the share covered where the new cases' labels were given);
* the per-case view (:mod:`mcseg.report.case_view`) of at most ``cases`` applied cases: the flagged ones first
  where statements exist, else the lowest Dice first (cases without a label last), with the conformal sure and
  possible masks where the folder has them; without an image the foreground probability is drawn and the page
  says so.
"""
from __future__ import annotations

import html
import json
import logging
import math
from pathlib import Path

import numpy as np

from mcseg.files import atomic_write

log = logging.getLogger(__name__)

__all__ = ["folder_output", "write_folder_report"]

STATEMENTS_FILE = "statements.json"
N_BINS = 15


def _json(path: Path) -> dict:
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return found if isinstance(found, dict) else {}


def folder_output(folder: Path) -> tuple[str, dict] | None:
    """``(tool, record)`` of a folder command's output folder (its calibration.json, conformal.json or
    statements.json), None for any other folder."""
    from mcseg.conformal.record import CONFORMAL_FILE
    from mcseg.evaluation.folder_outputs import CALIBRATE_TOOL, CALIBRATION_FILE, CONFORMAL_TOOL, NEW_CASES_TOOL

    folder = Path(folder)
    for name, tool in ((CONFORMAL_FILE, CONFORMAL_TOOL), (STATEMENTS_FILE, NEW_CASES_TOOL)):
        record = _json(folder / name)
        if record.get("tool") == tool:
            return tool, record
    record = _json(folder / CALIBRATION_FILE)
    if "applied" in record or _json(folder / "status.json").get("tool") == CALIBRATE_TOOL and record:
        return CALIBRATE_TOOL, record
    return None


def _paths(tool: str, record: dict) -> tuple[dict, dict, str | None]:
    """(the applied folder {path, format}, the reference {path}, the versions line) a record names."""
    from mcseg.evaluation.folder_outputs import CALIBRATE_TOOL, NEW_CASES_TOOL

    if tool == CALIBRATE_TOOL:
        applied = record.get("applied") or {}
        fit = next(iter((record.get("fits") or {}).values()), {})
        return ({"path": applied.get("to"), "format": applied.get("format")}, fit.get("reference") or {},
                None)
    provenance = record.get("provenance") or {}
    applied = (provenance.get("apply") or {}) if tool == NEW_CASES_TOOL else \
        {"path": (record.get("applied") or {}).get("to"), "format": (record.get("applied") or {}).get("format")}
    versions = provenance.get("versions")
    return applied, provenance.get("reference") or {}, (
        ", ".join(f"{k} {v}" for k, v in versions.items()) if isinstance(versions, dict) else None)


def _header(tool: str, folder: Path, record: dict) -> list[str]:
    applied, reference, versions = _paths(tool, record)
    if tool.endswith("calibrate-folder"):
        fits = [p for fit in (record.get("fits") or {}).values() for p in (fit.get("checkpoint") or {}).get("path") or []]
    else:
        provenance = record.get("provenance") or {}
        fits = [str(p.get("path") if isinstance(p, dict) else p) for p in
                (provenance.get("fit") or provenance.get("predictions") or [])]
    lines = [f"# {tool}: {folder.name}", "",
             f"Output folder `{folder}`. Fitted on `{', '.join(map(str, fits)) or '?'}` against the labels of "
             f"`{reference.get('path', '?')}`; applied to `{applied.get('path') or 'none'}` "
             f"({applied.get('format') or '?'} format)."]
    if versions:
        lines.append(f"Versions: {versions}.")
    return [*lines, ""]


def _calibration_lines(record: dict) -> list[str]:
    lines = ["## Fitted calibration", "", "| scaler | parameters | fit cases | fit voxels | region | NLL before -> "
             "after (fit voxels) |", "|---|---|---|---|---|---|"]
    for fit in (record.get("fits") or {}).values():
        for name, scaler in (fit.get("scalers") or {}).items():
            parameters = {k: v for k, v in scaler.items() if k in ("temperature", "weight", "bias", "calibrator")}
            lines.append(f"| {name} | {json.dumps(parameters)[:120] or '–'} | {fit.get('n_cases')} | "
                         f"{fit.get('n_voxels')} | {scaler.get('region', scaler.get('voxels', '–'))} | "
                         f"{scaler.get('nll_before', math.nan):.5g} -> {scaler.get('nll_after', math.nan):.5g} |")
    return [*lines, ""]


def _reliability(stats, title: str) -> str:
    from mcseg.report.html import reliability_svg

    top = stats.top
    count = top.count.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        conf, acc = top.confidence.numpy() / count, top.correct.numpy() / count
    return (f"<figure>{reliability_svg(title, np.nan_to_num(conf), np.nan_to_num(acc), count)}"
            f"<figcaption>{html.escape(title)}</figcaption></figure>")


def _applied_calibration(folder: Path, record: dict, reference, raw, calibrated, region: str) -> tuple[list, str]:
    """The before/after table lines and reliability diagrams over the labelled calibrated cases."""
    from mcseg.report.folder_cases import calibration_stats, read_folder_case

    before = after = None
    labelled = [c for c in calibrated.cases() if c in reference.labels]
    for case in labelled:
        grid, label, probs, _ = read_folder_case(calibrated, case, reference, None)
        _, _, raw_probs, _ = read_folder_case(raw, case, reference, None)
        b, a = calibration_stats(raw_probs, probs, label, region, grid.spacing, N_BINS)
        before, after = (b, a) if before is None else (before + b, after + a)
    if before is None:
        return ["No calibrated case has a label in the reference: no ECE before and after.", ""], ""
    vb, va = before.values(), after.values()
    lines = ["## On the calibrated cases", "",
             f"Top-label ECE ({N_BINS} equal-width bins) and NLL over the voxels of region `{region}` (each with its "
             f"own prediction) of the {len(labelled)} calibrated case(s) with a label, pooled; before: the saved "
             f"probabilities of `{raw.path}`, after: the calibrated files of this folder.", "",
             "| | ECE | NLL | Brier | voxels |", "|---|---|---|---|---|",
             f"| before | {vb['ece']:.4f} | {vb['nll']:.4f} | {vb['brier']:.4f} | {vb['n_voxels']} |",
             f"| after | {va['ece']:.4f} | {va['nll']:.4f} | {va['brier']:.4f} | {va['n_voxels']} |", ""]
    svg = ("<h2>Reliability before and after (hover a bin for its voxel count)</h2>"
           + _reliability(before, "before calibration") + _reliability(after, "after calibration"))
    return lines, svg


def _statements_figure(folder: Path, record: dict) -> str:
    """The statements figure (statements.png, else drawn from the rows) inline, with its caption."""
    import base64
    import io

    if (folder / "statements.png").is_file():
        data = (folder / "statements.png").read_bytes()
    else:
        from mcseg.statements.plots import statements_figure

        buffer = io.BytesIO()
        statements_figure(record["rows"], record["level"], record["n_calibration_cases"]).savefig(
            buffer, format="png", dpi=110)
        data = buffer.getvalue()
    caption = ("Per structure, each new case's volume interval around its mask volume (flagged cases red); where the "
               "new cases' labels were given, the true volume (black) and the share covered in the title.")
    return (f'<h2>Volume intervals and coverage</h2><figure><img alt="statements" src="data:image/png;base64,'
            f'{base64.b64encode(data).decode()}"><figcaption>{html.escape(caption)}</figcaption></figure>')


def _cases(tool: str, folder: Path, record: dict, reference, target, images, n: int, max_size: int,
           max_slices: int) -> tuple[list[dict], str]:
    """The drawn cases and the order they are listed in (module docstring)."""
    from mcseg.evaluation.folder_outputs import CONFORMAL_TOOL, NEW_CASES_TOOL
    from mcseg.report.case_view import render_volumes
    from mcseg.report.folder_cases import case_dice, case_volumes, read_folder_case
    from mcseg.report.statements import case_order

    masks = folder if tool == CONFORMAL_TOOL else None
    if tool == NEW_CASES_TOOL:
        order = [(case, f"FLAGGED for review (risk u = {risk:.3f})" if flag else f"ok (risk u = {risk:.3f})")
                 for case, flag, risk in case_order(record)][:n]
        reads = [(case, read_folder_case(target, case, reference, images), note) for case, note in order]
        how = "flagged for review first, then by risk score"
    else:
        scored = []
        for case in target.cases():
            read = read_folder_case(target, case, reference, images)
            if read is not None:
                scored.append((case_dice(read, reference.task), case))
        scored.sort(key=lambda t: (math.isnan(t[0]), t[0]))
        reads = [(case, read_folder_case(target, case, reference, images), None) for _, case in scored[:n]]
        how = "worst first by Dice"
    drawn = []
    for case, read, note in reads:
        if read is None:
            log.warning("report.html: case %s has no label nor image (--images): not drawn", case)
            continue
        volumes = case_volumes(read, case, note or Path(str(target.path)).name, reference, images, masks,
                               notes=[note] if note else None)
        drawn.append(render_volumes(volumes, max_size, max_slices))
    return drawn, how


def write_folder_report(folder: Path, out: Path | None = None, reference=None, images: Path | None = None,
                        cases: int = 6, max_size: int = 160, max_slices: int = 32,
                        class_names: list[str] | None = None) -> Path:
    """Write ``report.html`` and ``report.md`` of the folder command's output ``folder`` into ``out`` (default the
    folder; module docstring); ``reference``: the command's (else read from the recorded path, its classes from its
    dataset.json or ``class_names``); returns the page."""
    from mcseg.data.reference import FolderError, read_reference
    from mcseg.evaluation.folder_outputs import CALIBRATE_TOOL, CONFORMAL_TOOL
    from mcseg.evaluation.formats import open_folder
    from mcseg.report.html import HTML_FILE, case_section, markdown_html, page

    folder = Path(folder)
    out = Path(out) if out is not None else folder
    found = folder_output(folder)
    if found is None:
        raise ValueError(f"{folder}: no calibration.json, conformal.json or statements.json of a folder command")
    tool, record = found
    applied, recorded, _ = _paths(tool, record)
    lines, extra, notes = _header(tool, folder, record), "", []
    if reference is None:
        try:
            reference = read_reference(recorded.get("path") or folder, class_names)
        except (FolderError, ValueError, OSError) as exc:
            notes.append(f"Cases not drawn: the reference could not be read ({exc}; mcseg-report --class-names).")
    target = None
    if reference is not None and applied.get("path"):
        try:
            source = folder if tool == CALIBRATE_TOOL else Path(applied["path"])
            target = open_folder(source, reference.task, applied.get("format") or "auto")
        except (FolderError, ValueError, OSError) as exc:
            notes.append(f"Cases not drawn: {applied['path']} could not be read ({exc}).")
    if tool == CALIBRATE_TOOL:
        lines += _calibration_lines(record)
        if target is not None and not reference.task.multilabel:
            scaler = next(iter(next(iter(record["fits"].values()))["scalers"].values()), {})
            raw = open_folder(applied["path"], reference.task, applied.get("format") or "auto")
            more, extra = _applied_calibration(folder, record, reference, raw, target,
                                               scaler.get("region") or "union_foreground")
            lines += more
        elif target is not None:
            lines += ["Region-based (sigmoid) probabilities: no top-label ECE before and after is computed here.", ""]
    elif tool == CONFORMAL_TOOL:
        from mcseg.report.conformal import conformal_section, folder_fit

        lines += conformal_section([folder_fit(folder, record)], out)
    else:
        from mcseg.report.statements import qc_lines, statement_folder

        lines += ["## Statements for new cases", "", "Flagged cases first.", "",
                  *qc_lines(statement_folder(folder, record))]
        extra = _statements_figure(folder, record)
    drawn, how = (_cases(tool, folder, record, reference, target, images, cases, max_size, max_slices)
                  if target is not None and cases > 0 else ([], ""))
    text = "\n".join([*lines, *notes, ""])
    options = (f"{len(drawn)} case(s) drawn (at most {cases}), {how}; each on at most {max_slices} slices of at most "
               f"{max_size} pixels a side.")
    body = markdown_html(text, out) + extra + (case_section(drawn, options, how) if drawn else
                                               f"<h2>Cases</h2><p class=\"note\">No case drawn. {' '.join(notes)}</p>")
    out.mkdir(parents=True, exist_ok=True)
    document = page(f"{tool}: {folder.name}", body)
    atomic_write(out / "report.md", lambda tmp: tmp.write_text(text))
    atomic_write(out / HTML_FILE, lambda tmp: tmp.write_text(document, encoding="utf-8"))
    return out / HTML_FILE


def add_html_options(parser) -> None:
    """``--html-cases`` and ``--no-html`` of the folder commands (their report.html)."""
    parser.add_argument("--html-cases", type=int, default=6, help="cases drawn in OUT_DIR/report.html's per-case view "
                        "(default 6; 0: none)")
    parser.add_argument("--no-html", action="store_true", help="write no OUT_DIR/report.html (and report.md)")


def command_report(args, out: Path, reference, images: Path | None) -> Path | None:
    """A folder command's report.html at its end (unless ``--no-html``): a page that cannot be drawn is warned
    about and leaves the command's results as they are; the page, or None."""
    if getattr(args, "no_html", False):
        return None
    try:
        return write_folder_report(out, reference=reference, images=images, cases=args.html_cases)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        log.warning("report.html of %s not written: %s: %s", out, type(exc).__name__, exc)
        print(f"warning: report.html of {out} not written: {exc}")
        return None

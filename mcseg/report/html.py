"""``report.html``: report.md as one self-contained page that opens from disk with no network.

The page holds everything inline: report.md's text (protocol, provenance, warnings, every table, made sortable),
the report's figures as PNG data URIs, an SVG reliability diagram per selected configuration whose bins show their
confidence, accuracy and voxel count on hover (:func:`reliability_svg`), and the per-case view
(:mod:`mcseg.report.case_view`) of at most ``cases`` cases, the worst first by Dice. Style and script:
:mod:`mcseg.report.html_assets`. Its size is bounded by the number of cases drawn, their slices and pixels.
"""
from __future__ import annotations

import base64
import html
import json
import logging
import math
import re
from pathlib import Path

from mcseg.files import atomic_write
from mcseg.evaluation.case_files import CaseFiles, case_files, evaluation_folder
from mcseg.report.case_view import LAYERS, render_case
from mcseg.report.figures import pooled_reliability
from mcseg.report.html_assets import SCRIPT, STYLE
from mcseg.report.table import ConfigRow

log = logging.getLogger(__name__)

HTML_FILE = "report.html"
LAYER_LABELS = {"label": ("label (outline)", "#ffff00"), "prediction": ("prediction", "#1f77b4"),
                "uncertainty": ("uncertainty (entropy / log K)", "#b73779"),
                "possible": ("conformal possible (outline)", "#ff8c00"), "sure": ("conformal sure", "#2cc82c")}


def worst_cases(rows: list[ConfigRow], split: str, n: int, images: Path | None = None,
                labels: Path | None = None) -> list[CaseFiles]:
    """At most ``n`` cases of the selected rows (each row's first run) with a prediction or probabilities on disk:
    where a run has new-case statements (:func:`mcseg.report.statements.run_flags`), its cases flagged for review
    first (the riskiest first); then the lowest mean foreground Dice first (cases without a Dice last), the flag
    said in the case's name."""
    from mcseg.report.statements import run_flags

    ranked = []
    for row in rows:
        if not row.selected or not row.runs:
            continue
        run = row.runs[0]
        flags = run_flags(run, split)
        for case, values in (run.per_case.get("") or {}).items():
            dice = values.get("dice", math.nan)
            flag, risk = flags.get(case, (False, 0.0))
            ranked.append((not flag, -risk if flag else 0.0, math.isnan(dice), dice if not math.isnan(dice) else 0.0, row, run,
                           case, flag if case in flags else None))
    ranked.sort(key=lambda t: t[:4])
    out = []
    for _, _, _, _, row, run, case, flag in ranked:
        if len(out) >= n:
            break
        source = row.loss_name if row.hyperparameters == "defaults" else f"{row.loss_name} {row.hyperparameters}"
        source += "" if flag is None else (" — FLAGGED for review" if flag else " — not flagged")
        files = case_files(evaluation_folder(run, split), run.summaries.get("", {}), case, source,
                           run.per_case[""][case].get("dice", math.nan), images, labels)
        if files.prediction is not None or files.probabilities is not None:
            out.append(files)
    return out


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _inline(text: str, folder: Path) -> str:
    """Markdown's inline marks of one line as HTML: images (inlined when the file is in ``folder``), links,
    ``code`` and **bold**; the rest escaped."""
    out, last = [], 0
    for match in re.finditer(r"!\[([^\]]*)\]\(([^)]+)\)|\[([^\]]+)\]\(([^)]+)\)|`([^`]*)`|\*\*([^*]+)\*\*", text):
        out.append(html.escape(text[last:match.start()]))
        alt, src, word, href, code, bold = match.groups()
        if src is not None:
            path = folder / src
            out.append(f'<img alt="{html.escape(alt)}" src="{_data_uri(path)}">' if path.is_file()
                       else html.escape(f"[figure {alt}: {src} not found]"))
        elif word is not None:
            local = f"{html.escape(word)} (<code>{html.escape(href)}</code>)"
            out.append(html.escape(word) if "://" in href else local)
        elif code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        else:
            out.append(f"<strong>{html.escape(bold)}</strong>")
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_html(text: str, folder: Path) -> str:
    """report.md's Markdown (headings, paragraphs, lists, pipe tables, images) as HTML; every table sortable.
    Links to other sites are shown as text, never followed: the page requests nothing."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            body = [r for r in block[1:] if not re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*", r)]
            out.append('<div class="table-wrap"><table class="sortable"><thead><tr>'
                       + "".join(f"<th>{_inline(c, folder)}</th>" for c in _cells(block[0])) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c, folder)}</td>" for c in _cells(r)) + "</tr>"
                                 for r in body) + "</tbody></table></div>")
            continue
        heading = re.match(r"(#{1,4}) (.*)", line)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2), folder)}</h{level}>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:], folder)}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line, folder)}</p>")
        i += 1
    return "\n".join(out)


def reliability_svg(title: str, confidence, accuracy, counts) -> str:
    """A reliability diagram as SVG: one bar per bin of width 1/B up to its accuracy, the diagonal, and the bin's
    share of voxels as a grey strip below; hovering a bin shows its confidence, accuracy and voxel count."""
    n_bins, size, pad = len(counts), 260, 34
    total = float(sum(counts)) or 1.0
    parts = [f'<svg class="reliability" xmlns="http://www.w3.org/2000/svg" width="{size + pad + 10}" '
             f'height="{size + pad + 44}" role="img" aria-label="{html.escape(title)}">',
             f'<rect x="{pad}" y="10" width="{size}" height="{size}" fill="#fff" stroke="#999"/>',
             f'<line x1="{pad}" y1="{10 + size}" x2="{pad + size}" y2="10" stroke="#999" stroke-dasharray="4 3"/>']
    for b in range(n_bins):
        x, width = pad + size * b / n_bins, size / n_bins
        acc = float(accuracy[b]) if counts[b] > 0 and not math.isnan(float(accuracy[b])) else 0.0
        tip = (f"bin [{b / n_bins:.2f}, {(b + 1) / n_bins:.2f}): confidence {float(confidence[b]):.3f}, "
               f"accuracy {acc:.3f}, {int(counts[b])} voxels" if counts[b] > 0 else
               f"bin [{b / n_bins:.2f}, {(b + 1) / n_bins:.2f}): no voxels")
        share = math.log1p(float(counts[b])) / math.log1p(total) * 24
        parts.append(f'<rect class="bin" data-count="{int(counts[b])}" data-tip="{html.escape(tip)}" x="{x:.2f}" '
                     f'y="{10 + size * (1 - acc):.2f}" width="{width:.2f}" height="{size * acc:.2f}" '
                     f'fill="#1f77b4" fill-opacity="0.75" stroke="#fff"><title>{html.escape(tip)}</title></rect>')
        parts.append(f'<rect x="{x:.2f}" y="{size + 38 - share:.2f}" width="{width:.2f}" height="{share:.2f}" '
                     f'fill="#999"/>')
    for tick in (0, 0.5, 1):  # axis labels of both axes
        parts += [f'<text x="{pad + size * tick}" y="{size + 50}" font-size="10" text-anchor="middle">{tick:g}</text>',
                  f'<text x="{pad - 4}" y="{10 + size * (1 - tick) + 4}" font-size="10" text-anchor="end">'
                  f'{tick:g}</text>']
    parts += [f'<text x="{pad + size / 2}" y="{size + pad + 38}" font-size="11" text-anchor="middle">confidence '
              f'(bar below: voxels, log scale)</text>',
              f'<text x="10" y="{10 + size / 2}" font-size="11" transform="rotate(-90 10 {10 + size / 2})" '
              f'text-anchor="middle">accuracy</text>', "</svg>"]
    return "".join(parts)


def reliability_section(rows: list[ConfigRow], split: str) -> str:
    """The selected configurations' top-label reliability diagrams, pooled over their runs' cases and seeds."""
    figures = []
    for row in rows:
        if not row.selected:
            continue
        confidence, accuracy, counts = pooled_reliability([r.path for r in row.runs], split)
        if not len(counts):
            continue
        name = f"{row.dataset}: {row.loss_name} {row.hyperparameters}"
        figures.append(f"<figure>{reliability_svg(name, confidence, accuracy, counts)}"
                       f"<figcaption>{html.escape(name)}</figcaption></figure>")
    if not figures:
        return ""
    return ("<h2>Reliability diagrams (hover a bin for its voxel count)</h2><p>Top-label reliability on the "
            f"{html.escape(split)} split, pooled over cases and seeds (the evaluations' reliability.csv).</p>"
            + "".join(figures))


def case_section(cases: list[dict], options: str, order: str = "worst first by Dice") -> str:
    """The per-case view: a case list (in ``order``: worst first), the slice slider, one checkbox per overlay."""
    if not cases:
        return ("<h2>Cases</h2><p class=\"note\">No case drawn: no selected configuration has predictions or "
                "probabilities on disk (inference.save_predictions / save_probabilities).</p>")
    choices = "".join(
        f'<option value="{i}">{html.escape(c["id"])} — Dice '
        f'{"–" if c["dice"] is None else format(c["dice"], ".3f")} — {html.escape(c["source"])}</option>'
        for i, c in enumerate(cases))
    boxes = "".join(f'<label><input type="checkbox" id="show-{name}" checked> <span class="swatch" '
                    f'style="background:{colour}"></span>{html.escape(text)}</label>'
                    for name, (text, colour) in LAYER_LABELS.items())
    images = "".join(f'<img id="layer-{name}" alt="{name}">' for name in ("image", *LAYERS))
    data = json.dumps(cases, separators=(",", ":")).replace("</", "<\\/")
    return (f"<h2>Cases ({html.escape(order)})</h2><p>{html.escape(options)}</p>"
            f'<div id="viewer"><div id="stack">{images}</div><div id="controls">'
            f'<p><select id="case-select">{choices}</select></p>'
            f'<p><input type="range" id="slice" min="0" max="0" value="0"> <span id="slice-text"></span></p>'
            f'{boxes}<ul id="case-notes" class="note"></ul></div></div>'
            f'<script type="application/json" id="case-data">{data}</script>')


def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
            f'style-src \'unsafe-inline\'; script-src \'unsafe-inline\'">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>{body}"
            f'<div id="tooltip"></div><script>{SCRIPT}</script></body></html>')


def write_html(out: Path, text: str, title: str, rows: list[ConfigRow], split: str, figures: list[str],
               cases: int = 6, max_size: int = 160, max_slices: int = 32, images: Path | None = None,
               labels: Path | None = None) -> Path:
    """Write ``out/report.html`` (module docstring) from report.md's ``text``, the written figure files
    ``figures`` (names in ``out``) and the rows; returns its path. ``cases``, ``max_size`` and ``max_slices``
    bound the per-case view (cases drawn, pixels of a slice's longer side, slices per case)."""
    found = worst_cases(rows, split, cases, images, labels) if cases > 0 else []
    drawn = []
    for files in found:
        try:
            drawn.append(render_case(files, max_size, max_slices))
        except (OSError, ValueError) as exc:  # one unreadable case does not cost the page
            log.warning("report.html: case %s of %s not drawn: %s", files.case, files.source, exc)
    options = (f"{len(drawn)} case(s) drawn (at most {cases}: mcseg-report --html-cases), each on at most "
               f"{max_slices} slices of at most {max_size} pixels a side (--html-slices, --html-size); "
               "the slider starts at the slice with the most label and prediction.")
    body = markdown_html(text, out)
    shown = [name for name in figures if (out / name).is_file()]
    if shown:
        body += "<h2>Figures</h2>" + "".join(
            f'<figure><img alt="{html.escape(n)}" src="{_data_uri(out / n)}"><figcaption>{html.escape(n)}'
            f"</figcaption></figure>" for n in shown)
    flagged = any(f.source.endswith(("FLAGGED for review", "not flagged")) for f in found)
    body += reliability_section(rows, split) + case_section(
        drawn, options, "flagged for review first, then worst first by Dice" if flagged else "worst first by Dice")
    path = out / HTML_FILE
    document = page(title, body)
    atomic_write(path, lambda tmp: tmp.write_text(document, encoding="utf-8"))
    log.info("report.html: %.2f MB, %d case(s) drawn", path.stat().st_size / 1e6, len(drawn))
    return path

"""A study's tables from its committed pieces (:mod:`study_pieces`): ``per_evaluation.csv``, ``table.md`` (rows
scaled by a degenerate temperature fit marked) and its README; never from run folders."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import study_presets  # noqa: E402
from study_presets import STUDIES, STUDIES_DOC, pieces  # noqa: E402
from study_rater_table import rater_table  # noqa: E402
from uncertainty_study import COLUMNS, table  # noqa: E402


def write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["configuration", "predictor", "seed", "evaluation", "seconds", *COLUMNS])
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path) -> list[dict]:
    rows = []
    for row in csv.DictReader(open(path)):
        rows.append({**row, "seconds": float(row["seconds"]),
                     **{c: (float(row[c]) if row[c] not in ("", None) else None) for c in COLUMNS}})
    return rows


def assemble(study_name: str) -> str:
    """``table.md`` and ``per_evaluation.csv`` of the whole study from its committed pieces, and its README."""
    base = study_presets.results_dir(study_name)
    done = pieces(study_name)
    rows = [r for config in done for r in read_rows(base / config / "per_evaluation.csv")]
    if rows:
        write_rows(base / "per_evaluation.csv", rows)
        (base / "table.md").write_text(table([r for config in done for r in
                                              degenerate_marked(base / config, read_rows(base / config / "per_evaluation.csv"))]))
    if study_name.startswith("multirater") and rows:
        (study_presets.results_dir("multirater") / "raters_table.md").write_text(rater_table())
    (base / "README.md").write_text(readme(study_name, done))
    return (base / "table.md").read_text() if rows else "(no piece yet)\n"


DEGENERATE_MARK = " (degenerate fit)"


def degenerate_marked(piece_dir: Path, rows: list[dict]) -> list[dict]:
    """One piece's rows for the study's table, each row scaled by a degenerate temperature fit (its evaluation's
    summary.json, :func:`mcseg.calibration.posthoc.degenerate_reason`) marked in its predictor's name. A
    ``... + T`` row without an evaluation of its own is the scaled half of the row before the ``+ T``."""
    from mcseg.calibration.posthoc import degenerate_reason

    slugs = {(row["seed"], row["predictor"]): row["evaluation"] for row in rows}
    marked = []
    for row in rows:
        raw, scaled, _ = row["predictor"].partition(" + T")
        slug = row["evaluation"] or slugs.get((row["seed"], raw), "")
        path = piece_dir / slug / "summary.json"
        degenerate = False
        if scaled and slug and path.is_file():
            summary = json.loads(path.read_text())
            params = ((summary.get("posthoc") or {}).get("temperature") or {}).get("params")
            classes = (summary.get("protocol") or {}).get("num_classes", 2)
            degenerate = any(isinstance(p, dict) and (p.get("degenerate") or degenerate_reason(
                p, classes, bool(summary.get("multilabel")))) for p in (params if isinstance(params, list) else [params]))
        marked.append({**row, "predictor": row["predictor"] + DEGENERATE_MARK} if degenerate else row)
    return marked


def readme(study_name: str, done: dict[str, dict]) -> str:
    study = STUDIES[study_name]
    missing = [c for c in study.arms if c not in done]
    lines = [f"# {study_name}: raw tables, one folder per configuration (a piece)", "",
             (STUDIES_DOC[study_name]), "",
             "Written by `scripts/study_pieces.py` (its docstring says what a piece trains and evaluates). "
             "Each folder holds `per_evaluation.csv`, every evaluation's `summary.json` and `per_case.csv`, and "
             "`piece.json` (commit, load, cost). `table.md` and `per_evaluation.csv` here are assembled from "
             "the folders by `python scripts/study_pieces.py " + study_name + " --table`, never from run folders.",
             "", "| configuration | commit | finished | load average (mean / max of each run of the piece) | training s "
             "| evaluation s |",
             "|---|---|---|---|---|---|"]
    for config, piece in done.items():
        loads = "; then ".join(f"{r['load_average']['mean']} / {r['load_average']['max']}"
                               for r in [*piece.get("earlier_runs", []), piece])
        lines.append(f"| {config} | {piece['commit']} | {piece['finished']} | {loads} on "
                     f"{piece['load_average']['cores']} | {sum(piece['training_seconds'].values()):.0f} | "
                     f"{sum(piece['evaluation_seconds'].values()):.0f} |")
    lines += ["", "Pieces still to run: " + (", ".join(missing) if missing else "none (the study is complete)") + "."]
    if missing:
        lines += ["", "The next piece (about 20 to 40 minutes of both cores; commit its folder when it ends):", "",
                  "```bash", f"python scripts/study_pieces.py {study_name} --config {missing[0]}",
                  f"python scripts/study_pieces.py {study_name} --table", "```"]
    return "\n".join(lines) + "\n"

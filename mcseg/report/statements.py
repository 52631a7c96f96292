"""``## Statements for new cases`` of mcseg-report (docs/new_cases.md): every set of new-case statements found, with
its guarantee, its review rule and a per-case QC table, the flagged cases first (then by risk score, riskiest
first): per structure the volume with its interval in mL, the Dice lower bound and the HD95 upper bound; and where
the new cases' labels were given (to measure only), the coverage each statement reached on them.

Read from ``statements.json``: of a run's evaluation (``<run>/eval/<split>/conformal/<source>/statements/``,
``conformal.statements=true``) and of completed ``mcseg-new-cases`` output folders under the report's directories.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from mcseg.report.collect import RunRecord
from mcseg.report.conformal import tool_records

__all__ = ["StatementSet", "case_order", "collect_statements", "run_flags", "statement_folders", "statements_section"]

log = logging.getLogger(__name__)
FILE = "statements.json"
COVERED = ("volume", "volume_normalised", "dice", "hd95")


@dataclass
class StatementSet:
    label: str
    source: str
    folder: Path
    record: dict


def statement_folders(roots: list[Path]) -> list[StatementSet]:
    """The completed ``mcseg-new-cases`` outputs under ``roots`` (or ``roots`` themselves)."""
    from mcseg.evaluation.folder_outputs import NEW_CASES_TOOL

    return [statement_folder(folder, record) for folder, record in tool_records(roots, FILE, NEW_CASES_TOOL)]


def statement_folder(folder: Path, record: dict) -> StatementSet:
    """An ``mcseg-new-cases`` output as the report shows it, labelled by the folder's last two path parts."""
    return StatementSet("/".join(Path(folder).parts[-2:]), "saved files", Path(folder), record)


def collect_statements(runs: list[RunRecord], roots: list[Path], split: str) -> list[StatementSet]:
    found = []
    for run in runs:
        for source in (run.summaries.get("", {}).get("conformal") or {}):
            path = run.path / "eval" / split / "conformal" / source / "statements" / FILE
            if path.is_file():
                found.append(StatementSet(run.path.name, source, path.parent, json.loads(path.read_text())))
    return found + statement_folders(roots)


def _n(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    return "inf" if math.isinf(float(value)) else f"{float(value):.{digits}f}"


def case_order(record: dict) -> list[tuple[str, bool, float]]:
    """``(case, review flag, risk score)`` of a set of statements, the flagged cases first, then the riskiest."""
    first: dict[str, dict] = {}
    for row in record["rows"]:
        first.setdefault(row["case"], row)
    return sorted(((c, bool(r["review"]), float(r["risk_score"])) for c, r in first.items()),
                  key=lambda t: (not t[1], -t[2], t[0]))


def run_flags(run: RunRecord, split: str) -> dict[str, tuple[bool, float]]:
    """``{case: (review flag, risk score)}`` of a run's first set of statements on ``split`` (its evaluation's
    ``conformal/<source>/statements/statements.json``, the sources in order); empty without one."""
    for source in (run.summaries.get("", {}).get("conformal") or {}):
        path = Path(run.path) / "eval" / split / "conformal" / source / "statements" / FILE
        if path.is_file():
            try:
                record = json.loads(path.read_text())
                return {case: (flag, risk) for case, flag, risk in case_order(record)}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("%s: unreadable statements (%s); cases ordered by Dice", path, exc)
    return {}


def qc_lines(found: StatementSet) -> list[str]:
    record = found.record
    review = record["review"]
    structures = list(record.get("classes") or dict.fromkeys(r["structure"] for r in record["rows"]))
    rule = (f"flag when u > {review['threshold']:.3g}" if review["certified"] else "every case flagged")
    lines = [f"**{found.label}, {found.source}**: each statement holds with probability >= {record['level']:.3g} "
             f"({record['method']}; n = {record['n_calibration_cases']} calibration cases; {record['assumption']}). "
             f"Review: {rule} ({review['guarantee']}; {review['reason']}); "
             f"{review['flagged_new']} of {review['n_new']} new cases flagged."
             + (f" Warning: {record['warning']}." if record.get("warning") else ""), "",
             "| case | review | risk u | " + " | ".join(f"{s}: volume mL [interval] | {s}: Dice >= | {s}: HD95 <= mm"
                                                     for s in structures) + " |",
             "|---|---|---|" + "---|" * (3 * len(structures))]
    by_case: dict[str, dict[str, dict]] = {}
    for row in record["rows"]:
        by_case.setdefault(row["case"], {})[row["structure"]] = row
    for case, _, _ in case_order(record):
        first = next(iter(by_case[case].values()))
        cells = [f"{_n(r['volume_mask_ml'])} [{_n(r['volume_lower_ml'])}, {_n(r['volume_upper_ml'])}] | "
                 f"{_n(r['dice_lower'], 3)} | {_n(r['hd95_upper_mm'], 1)}"
                 for r in (by_case[case][s] for s in structures)]
        lines.append(f"| {case} | {'**FLAG**' if first['review'] else 'ok'} | {_n(first['risk_score'], 3)} | "
                     + " | ".join(cells) + " |")
    measured = [r for r in record["rows"] if "volume_covered" in r]
    if measured:
        cover = {f"{name}, {s}": sum(r[f"{name}_covered"] for r in measured if r["structure"] == s)
                 / max(1, sum(r["structure"] == s for r in measured)) for name in COVERED for s in structures}
        accepted = [r for r in measured if not r["review"]]
        rate = sum(r["failure"] for r in accepted) / len(accepted) if accepted else 0.0
        lines += ["", "Measured on the new cases' labels (never fitted on): coverage " + ", ".join(
            f"{k} {v:.2f}" for k, v in cover.items()) + f" (level {record['level']:.3g}); failure rate among the "
            f"cases not flagged {rate:.3f} (alpha {record['alpha']:g})."]
    return [*lines, ""]


def statements_section(found: list[StatementSet]) -> list[str]:
    if not found:
        return []
    lines = ["## Statements for new cases", "",
             "Per case, flagged cases first: the structure's volume with its conformal interval, a lower bound on its "
             "Dice and an upper bound on its HD95, fitted on labelled calibration cases, and the review flag chosen "
             "by Learn-then-Test (docs/new_cases.md). Guarantees are marginal over cases, not per case.", ""]
    for item in found:
        lines += qc_lines(item)
    return lines

"""Every statement for new cases from a labelled calibration table: per case and structure the volume with its
intervals, the Dice and HD95 bounds, and per case the review flag (:mod:`~mcseg.statements.intervals`,
:mod:`~mcseg.statements.review`), plain or weighted under shift (:mod:`~mcseg.statements.shift`). The rows are what
``statements.csv`` holds (columns: docs/new_cases.md); the record names each guarantee.

The new cases' truth, where their table has it, is used only to MEASURE (the ``*_true`` and ``*_covered`` columns),
never to fit: the fit reads the calibration table and the new cases' label-free figures only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcseg.files import write_csv, write_json
from mcseg.statements.intervals import STATEMENTS, available, bounds, covered, quantiles
from mcseg.statements.quantiles import effective_sample_size, minimum_cases
from mcseg.statements.review import PROCEDURES, failures, fit_review, risk_scores
from mcseg.statements.table import CaseTable

__all__ = ["ASSUMPTION", "OUTPUTS", "StatementSettings", "make_statements", "write_statements"]

OUTPUTS = ("statements.csv", "statements.json", "calibration_cases.csv", "new_cases.csv")

ASSUMPTION = ("the new case and the calibration cases are exchangeable (drawn from the same population: same "
              "scanner, protocol and model); the guarantee is marginal over the draw of the cases, per structure and "
              "per statement, not conditional on one case")
WEIGHTED_ASSUMPTION = ("covariate shift: the new cases differ from the calibration cases only in the distribution of "
                       "the label-free case features, P(truth | features) unchanged; the weights estimate the density "
                       "ratio, and the guarantee holds for the true ratio")
# what each statement's lower and upper end are called in statements.csv
COLUMNS = {"volume": ("volume_lower_ml", "volume_upper_ml"),
           "volume_normalised": ("volume_normalised_lower_ml", "volume_normalised_upper_ml"),
           "volume_members": ("volume_members_lower_ml", "volume_members_upper_ml"),
           "dice": ("dice_lower", None), "hd95": (None, "hd95_upper_mm")}


@dataclass
class StatementSettings:
    alpha: float = 0.1
    delta: float = 0.1
    floor: float = 0.7
    procedure: str = "fixed_sequence"

    def __post_init__(self) -> None:
        for key in ("alpha", "delta"):
            if not 0 < getattr(self, key) < 1:
                raise ValueError(f"--{key} {getattr(self, key)}: expected a value in (0, 1)")
        if not 0 <= self.floor <= 1:
            raise ValueError(f"--floor {self.floor}: expected a Dice in [0, 1]")
        if self.procedure not in PROCEDURES:
            raise ValueError(f"--procedure {self.procedure}: expected one of {', '.join(PROCEDURES)}")


def _finite(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def make_statements(calibration: CaseTable, new: CaseTable, settings: StatementSettings,
                    weights: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[list[dict], dict]:
    """``(rows, record)``: one row per new case and structure, and the guarantees (module docstring).
    ``weights``: the calibration and new cases' density-ratio weights (weighted statements)."""
    if not calibration.labelled:
        raise ValueError("the calibration cases need labels")
    if calibration.structures != new.structures:
        raise ValueError(f"calibration structures {calibration.structures} differ from the new cases' "
                         f"{new.structures}")
    shared = sorted(set(calibration.cases) & set(new.cases))
    if shared:
        raise ValueError(f"{len(shared)} new case(s) are calibration cases ({', '.join(shared[:10])}): no guarantee "
                         f"covers a case that calibrated it")
    label_free = new.unlabelled()
    names = available(calibration, label_free)  # volume_members: where both tables have the members' spread
    ends, q_record = {}, {}
    for name in names:
        q = (quantiles(calibration, name, settings.alpha) if weights is None else
             quantiles(calibration, name, settings.alpha, *weights))
        ends[name] = bounds(label_free, name, q)
        if weights is None:
            q_record[name] = {s: _finite(v) for s, v in zip(calibration.structures, q)}
    u_cal = risk_scores(calibration.figures["soft_dice"])
    rule = fit_review(u_cal, failures(calibration.figures["dice_true"], settings.floor), settings.alpha,
                      settings.delta, settings.floor, settings.procedure)
    u_new = risk_scores(label_free.figures["soft_dice"])
    flags = rule.flags(u_new)
    rows = []
    for i, case in enumerate(new.cases):
        for k, structure in enumerate(new.structures):
            row = {"case": case, "structure": structure,
                   **{n: float(label_free.figures[n][i, k]) for n in
                      ("volume_mask_ml", "volume_expected_ml", "volume_sd_ml", "volume_members_sd_ml")
                      if n in label_free.figures},
                   "dice_estimate": float(label_free.figures["soft_dice"][i, k]),
                   "hd95_estimate_mm": float(label_free.figures["band_mm"][i, k])}
            for name in names:
                (low, high), (lower, upper) = COLUMNS[name], ends[name]
                if low:
                    row[low] = float(lower[i, k])
                if high:
                    row[high] = float(upper[i, k])
            row.update(risk_score=float(u_new[i]), review=bool(flags[i]))
            if weights is not None:
                row["weight"] = float(weights[1][i])
            rows.append(row)
    if new.labelled:  # measured only, after every fit above
        fails = failures(new.figures["dice_true"], settings.floor)
        hits = {name: covered(new, name, *ends[name]) for name in names}
        for i in range(len(new)):
            for k in range(len(new.structures)):
                row = rows[i * len(new.structures) + k]
                row.update({t: float(new.figures[t][i, k]) for t in ("volume_true_ml", "dice_true", "hd95_true_mm")})
                row.update({f"{name}_covered": bool(hits[name][i, k]) for name in names})
                row["failure"] = bool(fails[i])
    record = {
        "level": 1 - settings.alpha, "alpha": settings.alpha,
        "method": ("weighted split conformal (Tibshirani et al. 2019)" if weights is not None else
                   "split conformal") + ", per structure (Mondrian), cases as the units",
        "n_calibration_cases": len(calibration), "minimum_cases_for_finite_bounds": minimum_cases(settings.alpha),
        "assumption": WEIGHTED_ASSUMPTION if weights is not None else ASSUMPTION,
        "statements": {name: STATEMENTS[name].text for name in names},
        "normalised_volume_scales": {name: STATEMENTS[name].scale for name in names if STATEMENTS[name].scale},
        "quantiles": q_record if weights is None else "one per new case (weighted): see statements.csv's bounds",
        "review": {**rule.record(), "score": "u = 1 - min over structures of the soft self-Dice",
                   "failure": f"a structure's Dice < {settings.floor}",
                   "guarantee": f"P(failure rate among the cases not flagged <= {settings.alpha}) >= "
                                f"{1 - settings.delta} (Learn-then-Test, {settings.procedure})",
                   "flagged_new": int(flags.sum()), "n_new": len(new)},
        "new_cases_labels": ("used only to measure (the *_true and *_covered columns), never to fit" if new.labelled
                             else "none"),
    }
    if len(calibration) < minimum_cases(settings.alpha):
        n = len(calibration)
        record["warning"] = (f"{n} calibration cases are too few for finite bounds at alpha {settings.alpha} (at "
                             f"least {minimum_cases(settings.alpha)}; {n} cases allow alpha >= {1 / (n + 1):.3g}, "
                             f"option --alpha or conformal.alpha): the bounds are infinite")
    if weights is not None:
        record["shift"] = {"n_eff": effective_sample_size(weights[0]),
                           "weights_calibration": {"min": float(weights[0].min()), "max": float(weights[0].max())},
                           "weights_new": {"min": float(weights[1].min()), "max": float(weights[1].max())}}
        record["review"]["note"] = "the review rule is not weighted: its guarantee is the exchangeable one"
    return rows, record


def write_statements(out: Path, calibration: CaseTable, new: CaseTable, rows: list[dict], record: dict,
                     figure: bool = False):
    """:data:`OUTPUTS` into ``out``: the two per-case tables, statements.csv (``rows``) and statements.json; with
    ``figure`` also ``statements.png`` (:func:`mcseg.statements.plots.statements_figure`), returned for a tracker."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    calibration.write(out / "calibration_cases.csv")
    new.write(out / "new_cases.csv")
    write_csv(out / "statements.csv", rows)
    write_json(out / "statements.json", {**record, "rows": rows} if "rows" not in record else record)
    if not figure:
        return None
    from mcseg.files import atomic_write
    from mcseg.statements.plots import statements_figure

    drawn = statements_figure(rows, record["level"], len(calibration))
    atomic_write(out / "statements.png", lambda tmp: drawn.savefig(tmp, format="png", dpi=110))
    return drawn

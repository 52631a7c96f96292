"""Tables of the hippocampus conformal results (docs/results.md, "Conformal guarantees"; issue #46, item 7) from
the committed pieces under docs/results/conformal/<run>/ (no run folder needed):

* ``fixed/a<alpha>/<raw|temperature>/conformal.json``: evaluate.py's CRC fit on a run's validation split applied
  to its test split;
* ``validity_<source>.csv``: scripts/conformal_validity.py over random splits of the run's pooled cases (raw,
  temperature; grid1001_raw, grid1001_temperature: the same on a grid of 1001 thresholds);
* ``<method>_<loss>/`` (e.g. ``rcps_fnr``, ``ltt_fdr``): another method's (or loss's) pieces, laid out as the
  run's CRC pieces above (``fixed/``: mcseg-conformal-folder's conformal.json and per_case.csv).

Writes ``summary.md`` there: the fixed split per run, alpha, source and class; the random splits likewise, with the
standard deviation of the test FNR over the splits (the script's Monte-Carlo standard error times sqrt(splits));
and, per alpha and class, in how many runs temperature scaling gave smaller sets than the raw probabilities; then
per other method, its figures over the seeds beside CRC's set volumes, and its per-run tables.

    python scripts/conformal_results.py docs/results/conformal
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

SOURCES = ("raw", "temperature")


def _runs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "fixed").is_dir())


def _alphas(run: Path) -> list[str]:
    return sorted((p.name[1:] for p in (run / "fixed").iterdir()), key=float)


def variants(root: Path) -> list[str]:
    """The other methods' piece folders of the runs (``<method>_<loss>``), sorted."""
    return sorted({p.name for run in _runs(root) for p in run.iterdir() if p.is_dir() and p.name != "fixed"})


def fixed_rows(root: Path, variant: str = "") -> list[dict]:
    """Per run, alpha, source and class: the fit on the validation split and its test figures (``variant``:
    another method's pieces; a source not measured is left out). The test risk is named by its loss
    (``test_fnr``, ``test_fdr``); a variant's rows also give the calibration risk at the threshold and the
    ``bound`` its method compared with alpha there (RCPS's upper confidence bound, LTT's p-value)."""
    rows = []
    for run in _runs(root):
        base = run / variant
        if not (base / "fixed").is_dir():
            continue
        for alpha in _alphas(base):
            for source in SOURCES:
                path = base / "fixed" / f"a{alpha}" / source / "conformal.json"
                if not path.is_file():
                    continue
                record = json.loads(path.read_text())
                for name, fit in record["classes"].items():
                    test = record["test"][name]
                    row = {"run": run.name, "alpha": alpha, "source": source, "class": name,
                           "threshold": fit["threshold"], "controlled": fit["controlled"]}
                    if variant:  # the calibration risk at t and what the method compared with alpha there
                        row.update({"calibration_risk": fit["calibration_risk"], "bound": fit["bound"]})
                    rows.append({**row, "n_val": fit["n_cases"], f"test_{record.get('loss', 'fnr')}": test["mean_loss"],
                                 "test_cases_above_alpha": f"{test['loss_above_alpha']}/{test['n_cases_with_class']}",
                                 "set_over_prediction": test["mean_set_over_prediction"],
                                 "possible_over_prediction": test["mean_possible_over_prediction"],
                                 "outer_mm": fit["margin"]["outer_mm"], "inner_mm": fit["margin"]["inner_mm"],
                                 "covered": test["covered"], "sure_inside": test["sure_inside"]})
    return rows


def split_rows(root: Path, variant: str = "") -> list[dict]:
    """Per run, alpha, source and class: the figures over the random splits (``variant``: another method's);
    the mean test risk is named by its loss (``mean_test_fnr``, ``mean_test_fdr``)."""
    rows = []
    for run in _runs(root):
        for path in sorted((run / variant).glob("validity_*.csv")):  # validity_<source>.csv, e.g. raw, grid1001_raw
            source = path.stem[len("validity_"):]
            with path.open() as f:
                for r in csv.DictReader(f):
                    splits = int(r["splits"])
                    rows.append({"run": run.name, "alpha": r["alpha"], "source": source, "class": r["class"],
                                 "splits": splits, "n_cal/n_test": f"{r['n_calibration']}/{r['n_test']}",
                                 f"mean_test_{r.get('loss') or 'fnr'}": float(r["mean_test_risk"]),
                                 "sd_over_splits": float(r["mean_test_risk_se"]) * math.sqrt(splits),
                                 "splits_above_alpha": float(r["violation_rate"]),
                                 "mean_threshold": float(r["mean_threshold"]),
                                 "uncontrolled_splits": int(r["uncontrolled_splits"]),
                                 "set_over_prediction": float(r["mean_set_over_prediction"]),
                                 "mean_outer_mm": float(r["mean_outer_mm"]), "covered": float(r["mean_covered"]),
                                 "mean_inner_mm": float(r["mean_inner_mm"]),
                                 "sure_inside": float(r["mean_sure_inside"])})
    return rows


def _temperature(path: Path) -> float:
    fit = next(iter(json.loads(path.read_text())["fits"].values()))
    return fit["scalers"]["temperature"]["temperature"]


def temperature_rows(root: Path) -> list[dict]:
    """Per run: the temperature evaluate.py applied (the run's own fit, calibration.json) and the one
    mcseg-calibrate-folder fitted on the saved validation probabilities (for the calibrated folders of the
    random splits)."""
    return [{"run": run.name, "T_run_fit": _temperature(run / "run_calibration.json"),
             "T_folder_fit": _temperature(run / "folder_calibration.json")} for run in _runs(root)]


def smaller_after_temperature(rows: list[dict], key: str) -> list[dict]:
    """Per alpha and class: in how many runs the temperature-scaled set was smaller / larger than the raw one."""
    by = {(r["run"], r["alpha"], r["class"], r["source"]): r[key] for r in rows}
    out = {}
    for (run, alpha, name, source), value in by.items():
        if source != "raw" or (run, alpha, name, "temperature") not in by:
            continue
        diff = by[(run, alpha, name, "temperature")] - value
        cell = out.setdefault((float(alpha), name), {"alpha": alpha, "class": name, "runs": 0, "smaller": 0,
                                                     "larger": 0, "mean_change": 0.0})
        cell["runs"] += 1
        cell["smaller"] += diff < 0
        cell["larger"] += diff > 0
        cell["mean_change"] += diff
    for cell in out.values():
        cell["mean_change"] /= cell["runs"]
    return [out[k] for k in sorted(out)]


def _range(values: list[float]) -> str:
    return f"{min(values):.3g}" if min(values) == max(values) else f"{min(values):.3g}–{max(values):.3g}"


def _per_loss(fixed: list[dict], splits: list[dict]) -> dict[tuple, dict]:
    """The rows of the fixed split and of the random splits grouped by loss (the run's name before ``_s<seed>``),
    alpha, source and class: ``{key: {"fixed": [...], "splits": [...]}}``."""
    groups: dict[tuple, dict] = {}
    for kind, rows in (("fixed", fixed), ("splits", splits)):
        for r in rows:
            key = (r["run"].rsplit("_s", 1)[0], float(r["alpha"]), r["source"], r["class"])
            groups.setdefault(key, {"fixed": [], "splits": []})[kind].append(r)
    return groups


def by_loss(fixed: list[dict], splits: list[dict]) -> list[dict]:
    """Per loss (the run's name before ``_s<seed>``), alpha, source and class, over its seeds: the range of the
    thresholds, of the fixed split's test FNR and of the splits' mean test FNR, the largest spread and share of
    splits above alpha, the mean volume ratios and the range of the outer margin."""
    groups = _per_loss(fixed, splits)
    out = []
    for (loss, alpha, source, name), g in sorted(groups.items()):
        f, s = g["fixed"], g["splits"]
        if not f:  # a variant measured over the random splits only (e.g. a finer grid)
            f = [{"threshold": float("nan"), "test_fnr": float("nan"), "set_over_prediction": float("nan"),
                  "possible_over_prediction": float("nan"), "outer_mm": float("nan"), "covered": float("nan")}]
        out.append({"loss": loss, "alpha": alpha, "source": source, "class": name, "seeds": len(f),
                    "threshold": _range([r["threshold"] for r in f]),
                    "fixed_test_fnr": _range([r["test_fnr"] for r in f]),
                    "fixed_set_over_pred": float(sum(r["set_over_prediction"] for r in f) / len(f)),
                    "fixed_possible_over_pred": float(sum(r["possible_over_prediction"] for r in f) / len(f)),
                    "fixed_outer_mm": _range([r["outer_mm"] for r in f]),
                    "fixed_covered_min": min(r["covered"] for r in f),
                    "splits_seeds": len(s),
                    "splits_mean_fnr": _range([r["mean_test_fnr"] for r in s]) if s else "–",
                    "splits_sd_max": max(r["sd_over_splits"] for r in s) if s else "–",
                    "splits_above_alpha_max": max(r["splits_above_alpha"] for r in s) if s else "–",
                    "splits_set_over_pred": float(sum(r["set_over_prediction"] for r in s) / len(s)) if s else "–",
                    "splits_outer_mm": _range([r["mean_outer_mm"] for r in s]) if s else "–",
                    "splits_covered_min": min(r["covered"] for r in s) if s else "–"})
    return out


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values))


def against_crc(root: Path, variant: str) -> list[dict]:
    """Per loss (the run's name before ``_s<seed>``), alpha, source and class, over the seeds: another method's
    thresholds, how many fits were controlled, its fixed split's test risk and share of test cases above alpha,
    over the random splits its mean test risk, the largest spread, violation rate (splits with test risk > alpha)
    and range of uncontrolled splits; and its set volume over the prediction beside CRC's (the same runs, alpha,
    source and class: what the stronger guarantee costs)."""
    risk = variant.rsplit("_", 1)[1]
    crc = {}
    for kind, rows in (("fixed", fixed_rows(root)), ("splits", split_rows(root))):
        for r in rows:
            crc.setdefault((kind, r["run"].rsplit("_s", 1)[0], float(r["alpha"]), r["source"], r["class"]),
                           []).append(r["set_over_prediction"])
    groups = _per_loss(fixed_rows(root, variant), split_rows(root, variant))
    out = []
    for (loss, alpha, source, name), g in sorted(groups.items()):
        f, s = g["fixed"], g["splits"]
        row = {"loss": loss, "method": variant, "alpha": alpha, "source": source, "class": name, "seeds": len(f)}
        if f:
            row.update({"threshold": _range([r["threshold"] for r in f]),
                        "fixed_controlled": f"{sum(bool(r['controlled']) for r in f)}/{len(f)}",
                        f"fixed_test_{risk}": _range([r[f"test_{risk}"] for r in f]),
                        "fixed_cases_above_alpha": _range([int(r["test_cases_above_alpha"].split("/")[0])
                                                           for r in f]),
                        "fixed_set_over_pred": _mean([r["set_over_prediction"] for r in f]),
                        "crc_fixed_set_over_pred": _mean(crc.get(("fixed", loss, alpha, source, name), [math.nan]))})
        if s:
            row.update({"splits_seeds": len(s), f"splits_mean_{risk}": _range([r[f"mean_test_{risk}"] for r in s]),
                        "splits_sd_max": max(r["sd_over_splits"] for r in s),
                        "splits_violation_max": max(r["splits_above_alpha"] for r in s),
                        "splits_uncontrolled": _range([r["uncontrolled_splits"] for r in s]),
                        "splits_set_over_pred": _mean([r["set_over_prediction"] for r in s]),
                        "crc_splits_set_over_pred": _mean(crc.get(("splits", loss, alpha, source, name),
                                                                  [math.nan]))})
        out.append(row)
    return out


def markdown(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    columns = list(rows[0])

    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(c, "–")) for c in columns) + " |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="docs/results/conformal")
    args = p.parse_args(argv)
    fixed, splits = fixed_rows(args.root), split_rows(args.root)
    text = ["# Conformal guarantees on hippocampus: tables (scripts/conformal_results.py)", "",
            "## Temperatures (each fitted on the run's 31 validation cases)", "", markdown(temperature_rows(args.root)),
            "",
            "## Per loss, over its seeds (ranges min–max; set_over_pred: mean over the seeds)", "",
            markdown(by_loss(fixed, splits)), "",
            "## Fixed split: CRC fitted on the run's 31 validation cases, applied to its 31 test cases", "",
            markdown(fixed), "",
            "## Random splits of the pooled 62 cases (validation + test), 31 to calibrate", "",
            "sd_over_splits: the standard deviation of the split's test FNR over the splits (dependent repeats of "
            "one pool: a sanity check, not an exact test).", "", markdown(splits), "",
            "## Temperature against raw: set volume over prediction, fixed split", "",
            markdown(smaller_after_temperature(fixed, "set_over_prediction")), "",
            "## Temperature against raw: set volume over prediction, mean over the random splits", "",
            markdown(smaller_after_temperature(splits, "set_over_prediction")), ""]
    for variant in variants(args.root):
        text += [f"## {variant}: over the seeds, beside CRC's sets", "",
                 "threshold, fixed_*: mcseg-conformal-folder fitted on the run's 31 validation cases, applied to its "
                 "31 test cases; splits_*: the random splits as above; fixed_controlled: fits with a valid threshold "
                 "(an uncontrolled fit returns the most conservative grid threshold); splits_uncontrolled: such "
                 "splits of the 200; crc_*: CRC of the FNR, same runs, alpha, source and class.", "",
                 markdown(against_crc(args.root, variant)), "",
                 f"### {variant}: fixed split, per run", "", markdown(fixed_rows(args.root, variant)), "",
                 f"### {variant}: random splits, per run", "", markdown(split_rows(args.root, variant)), ""]
    (args.root / "summary.md").write_text("\n".join(text))
    print(f"{len(fixed)} fixed-split rows, {len(splits)} random-split rows -> {args.root / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every figure of docs/results.md's "Corrections" (issue #43), recomputed from the committed raw pieces only.

    python scripts/results_corrections.py            # the multi-rater table of docs/results.md, then the checks

Also the figures of the second "Corrections" list (issue #55): the multi-rater targets against the spread of the
mean's three seeds, the post-hoc calibrators' changed voxels against the voxels they are a share of, LTS's fit
voxels, and how far a temperature moved the RCPS / Learn-then-Test sets at alpha 0.2.

Reads docs/results/<study>/... (summary.json, per_evaluation.csv, piece.json, provenance.json, shift.csv,
shift_summary.json, the conformal pieces through scripts/conformal_results.py); prints the rows of the multi-rater table as docs/results.md shows them (every row against
the same references) and each corrected figure with the raw values it rests on. Nothing here is trained or
evaluated.
"""
from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
MAJORITY_TARGETS = ("majority", "mean", "random")  # as scripts/study_rater_table.py


def summary(study: str, config: str, evaluation: str) -> dict:
    return json.loads((RESULTS / study / config / evaluation / "summary.json").read_text())


def target(study: str, config: str) -> str:
    overrides = json.loads((RESULTS / study / config / "piece.json").read_text())["overrides"]
    found = [o.split("=", 1)[1] for o in overrides if o.startswith("dataset.raters.target=")]
    return found[0] if found else "majority"


def figures(s: dict) -> dict:
    """The multi-rater figures of one evaluation (None where not defined)."""
    r = s["raters"]

    def mean(part, key):
        value = (r[part].get(key) or {}).get("mean")
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else value
    return {"Dice (majority)": s["mean_foreground_dice"], "ECE (majority)": s["mean_ece"],
            **{f"Dice vs {name}": v["mean_foreground_dice"] for name, v in r["per_rater"].items()},
            **{f"CURVAS ECE vs {name}": v["ece_curvas"] for name, v in r["per_rater"].items()},
            "Dice vs raters": mean("foreground", "dice_rater_mean"),
            "QUBIQ Dice": mean("foreground", "thresholded_dice"),
            "ECE vs rater mean": mean("case", "ece_mean"), "NLL vs rater mean": mean("case", "nll_mean"),
            "CURVAS ECE, mean over raters": mean("case", "ece_curvas_rater_mean"),
            "volume CRPS": mean("foreground", "volume_crps"), "GED": mean("case", "ged"),
            "HM-IoU": mean("case", "hm_iou")}


MULTIRATER_ROWS = [  # (configuration, predictor, [(study, config, evaluation), ...])
    ("CE, rater mean", "seed 0", [("multirater", "ce_mean", "single_seed0")]),
    ("CE, one rater (original)", "seed 0", [("multirater", "ce_original", "single_seed0")]),
    ("CE, random rater", "seed 0", [("multirater", "ce_random", "single_seed0")]),
    ("margin, rater mean", "seed 0", [("multirater", "margin3_mean", "single_seed0")]),
    ("margin, one rater (original)", "seed 0", [("multirater", "margin3_original", "single_seed0")]),
    ("margin, random rater", "seed 0", [("multirater", "margin3_random", "single_seed0")]),
    ("CE, rater mean", "seeds 1, 2", [("multirater_ensembles", "ce_mean", f"single_seed{s}") for s in (1, 2)]),
    ("CE, rater mean", "ensemble of 3", [("multirater_ensembles", "ce_mean", "ensemble")]),
    ("margin, rater mean", "seeds 1, 2", [("multirater_ensembles", "margin3_mean", f"single_seed{s}") for s in (1, 2)]),
    ("margin, rater mean", "ensemble of 3", [("multirater_ensembles", "margin3_mean", "ensemble")]),
]
MULTIRATER_COLUMNS = [("Dice (majority)", 3), ("ECE (majority)", 3), ("Dice vs original", 3),
                      ("CURVAS ECE vs original", 3), ("Dice vs raters", 3), ("QUBIQ Dice", 3),
                      ("ECE vs rater mean", 3), ("NLL vs rater mean", 3), ("CURVAS ECE, mean over raters", 3),
                      ("volume CRPS", 2), ("GED", 3), ("HM-IoU", 3)]


def multirater_table() -> list[str]:
    """The rows of docs/results.md's multi-rater table: a network trained on one rater was scored against that
    rater as its hard label, so its majority-label cells are 'not scored'."""
    lines = []
    for label, predictor, sources in MULTIRATER_ROWS:
        hard = target("multirater", sources[0][1])
        on_majority = hard in MAJORITY_TARGETS
        values = [figures(summary(*source)) for source in sources]
        cells = []
        for column, digits in MULTIRATER_COLUMNS:
            if column.endswith("(majority)") and not on_majority:
                cells.append("not scored")
                continue
            texts = [f"{v[column]:.{digits}f}" if v[column] is not None else "-" for v in values]
            cells.append("-" if set(texts) == {"-"} else ", ".join(texts))
        lines.append("| " + " | ".join([label, predictor, "majority" if on_majority else hard, *cells]) + " |")
    return lines


def multirater_checks() -> None:
    for loss in ("ce", "margin3"):
        m, o, r = (figures(summary("multirater", f"{loss}_{t}", "single_seed0")) for t in ("mean", "original", "random"))
        print(f"{loss}: Dice vs original: mean {m['Dice vs original']:.4f}, original {o['Dice vs original']:.4f} "
              f"(gap {o['Dice vs original'] - m['Dice vs original']:.4f}); the old gap (majority column) "
              f"{o['Dice (majority)'] - m['Dice (majority)']:.4f}")
        for column in ["Dice vs original", "Dice vs eroded", "Dice vs dilated", "Dice vs shifted_a", "Dice vs shifted_b",
                       "Dice vs raters", "QUBIQ Dice", "ECE vs rater mean", "NLL vs rater mean",
                       "CURVAS ECE, mean over raters", "volume CRPS"]:
            higher = "Dice" in column
            values = {"mean": m[column], "original": o[column], "random": r[column]}
            best = (max if higher else min)(values, key=values.get)
            print(f"   {column}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()) + f" -> best {best}")
        print(f"   mean vs random, ECE (majority): {m['ECE (majority)']:.4f} vs {r['ECE (majority)']:.4f}")
    seeds = {s: figures(summary("multirater_ensembles", "ce_mean", f"single_seed{s}")) for s in (0, 1, 2)}
    mseeds = {s: figures(summary("multirater_ensembles", "margin3_mean", f"single_seed{s}")) for s in (0, 1, 2)}
    for s in (0, 1, 2):
        print(f"seed {s}: ECE (majority) CE {seeds[s]['ECE (majority)']:.4f} margin {mseeds[s]['ECE (majority)']:.4f} "
              f"ratio {seeds[s]['ECE (majority)'] / mseeds[s]['ECE (majority)']:.2f}; ECE vs original (every voxel, 50 "
              f"bins) CE {seeds[s]['CURVAS ECE vs original']:.4f} margin {mseeds[s]['CURVAS ECE vs original']:.4f}; "
              f"CRPS ratio {mseeds[s]['volume CRPS'] / seeds[s]['volume CRPS']:.1f}")
    for loss in ("ce_mean", "margin3_mean"):
        ens = figures(summary("multirater_ensembles", loss, "ensemble"))
        members = [figures(summary("multirater_ensembles", loss, f"single_seed{s}")) for s in (0, 1, 2)]
        worse = []
        for column, value in ens.items():
            if value is None or column in ("GED", "HM-IoU"):
                continue
            higher = "Dice" in column
            if (value < members[0][column]) if higher else (value > members[0][column]):
                worse.append(f"{column} {value:.4f} vs seed 0 {members[0][column]:.4f}")
        print(f"{loss} ensemble worse than its seed-0 member in: {worse}")
    commits = {json.loads(p.read_text())["commit"] for p in RESULTS.glob("multirater*/*/piece.json")}
    recorded = {json.loads(p.read_text())["environment"]["code"]["git_commit"][:7]
                for p in RESULTS.glob("multirater*/*/*/provenance.json") if "environment" in json.loads(p.read_text())}
    print(f"multirater pieces' commit: {commits}; provenance git_commit: {recorded}")


SPREAD_COLUMNS = ["Dice vs original", "Dice vs eroded", "Dice vs dilated", "Dice vs shifted_a", "Dice vs shifted_b",
                  "CURVAS ECE vs original", "Dice vs raters", "QUBIQ Dice", "ECE vs rater mean", "NLL vs rater mean",
                  "CURVAS ECE, mean over raters", "volume CRPS"]


def seed_spread_checks() -> None:
    """Each target's seed-0 figure against the mean's three seeds, two ways: (a) inside their range [min, max];
    (b) its difference from the mean's seed 0 no larger than that range's width. The majority-label columns
    only for the random rater (the networks trained on `original` were not scored against the majority)."""
    for loss in ("ce", "margin3"):
        seeds = [figures(summary("multirater_ensembles", f"{loss}_mean", f"single_seed{s}")) for s in (0, 1, 2)]
        for t in ("original", "random"):
            other = figures(summary("multirater", f"{loss}_{t}", "single_seed0"))
            columns = SPREAD_COLUMNS + (["Dice (majority)", "ECE (majority)"] if t == "random" else [])
            outside, larger = [], []
            for column in columns:
                values = [s[column] for s in seeds]
                lo, hi = min(values), max(values)
                difference = other[column] - seeds[0][column]
                if not lo <= other[column] <= hi:
                    outside.append(f"{column} {other[column]:.4f} vs {lo:.4f}-{hi:.4f}")
                if abs(difference) > hi - lo:
                    larger.append(f"{column} {difference:+.4f} vs range {hi - lo:.4f}")
            print(f"{loss} {t}: (a) outside the mean's three seeds in {len(outside)} of {len(columns)}: {outside}")
            print(f"{loss} {t}: (b) difference from the mean's seed 0 larger than the seeds' range in "
                  f"{len(larger)} of {len(columns)}: {larger}")


ARGMAX_MOVERS = ("vector-balanced", "histogram", "histogram_top", "isotonic", "isotonic_top", "ms", "msc",
                 "dirichlet", "cms")


def posthoc_checks() -> None:
    """The calibrators that move the arg-max: changed voxels over every voxel of the test volumes (what the
    evaluation's ``fraction_changed`` is) and over the raw prediction's region (``pooled.n_voxels``; a changed
    voxel outside it, made foreground outside label and raw prediction, is counted too); LTS's fit voxels."""
    counts, of_all, of_region, totals, regions, lts = [], [], [], set(), [], set()
    for path in sorted((RESULTS / "posthoc_calibrators").glob("*/runs/*/summary.json")):
        s = json.loads(path.read_text())
        regions.append(s["pooled"]["n_voxels"])
        params = s["posthoc"]["lts"]["params"]
        lts.add((params["voxels"], len(params["train_cases"]), len(params["heldout_cases"]),
                 tuple(params["config"]["patch_size"]), params["config"]["foreground_ratio"],
                 params["argmax_changes"]["voxels"]))
        for name in ARGMAX_MOVERS:
            change = s["posthoc"][name]["segmentation"]
            counts.append(change["voxels_changed"])
            totals.add(change["voxels"])
            of_all.append(change["voxels_changed"] / change["voxels"])
            of_region.append(change["voxels_changed"] / s["pooled"]["n_voxels"])
    print(f"post-hoc, {len(counts)} fits that can move the arg-max: {min(counts)} to {max(counts)} voxels changed; "
          f"of every test voxel ({totals}) {100 * min(of_all):.2f} to {100 * max(of_all):.2f}%; of the raw region "
          f"({min(regions)} to {max(regions)} voxels) {100 * min(of_region):.1f} to {100 * max(of_region):.1f}%")
    print(f"LTS fits (voxels, train cases, held-out cases, patch, foreground share, argmax counted on): {lts}")


def conformal_temperature_checks() -> None:
    """RCPS / LTT at alpha 0.2: the largest move of a set's volume over the prediction (mean of the seeds, fixed
    split and splits) between the raw probabilities and after temperature scaling."""
    from conformal_results import against_crc, variants
    root, moves = RESULTS / "conformal", []
    for variant in variants(root):
        rows = {(r["loss"], r["alpha"], r["class"], r["source"]): r for r in against_crc(root, variant)}
        for (loss, alpha, name, source), raw in rows.items():
            scaled = rows.get((loss, alpha, name, "temperature"))
            if source != "raw" or alpha != 0.2 or scaled is None:
                continue
            for key in ("fixed_set_over_pred", "splits_set_over_pred"):
                if key in raw and key in scaled:
                    moves.append((abs(scaled[key] - raw[key]), variant, loss, name, key, raw[key], scaled[key]))
    moves.sort(reverse=True)
    print("RCPS / LTT at alpha 0.2, largest set moves after T: " + "; ".join(
        f"{v} {loss} {name} {key} {a:.4f} -> {b:.4f} ({m:.4f})" for m, v, loss, name, key, a, b in moves[:3]))


def shift_checks() -> None:
    single = {}
    with open(RESULTS / "shift_study" / "shift.csv") as f:
        for r in csv.DictReader(f):
            single[(r["loss"], r["predictor"], r["metric"], int(r["level"]))] = float(r["mean"])
    for config, loss in (("ce_dice", "ce_dice"), ("margin3", "margin")):
        s = json.loads((RESULTS / "ensembles_under_shift" / config / "ensemble" / "shift_summary.json").read_text())
        values = s["predictors"]["raw"]["dice"]["values"]
        levels = [next(iter(values.values()))["0"]] + [statistics.mean(v[str(level)] for v in values.values())
                                                      for level in range(1, 6)]
        moves = [e - single[(loss, "single", "dice", level)] for level, e in enumerate(levels)]
        print(f"{config}: ensemble Dice minus seed 0's, levels 0-5: " + ", ".join(f"{d:+.4f}" for d in moves))


def uncertainty_checks() -> None:
    with open(RESULTS / "uncertainty_study" / "per_evaluation.csv") as f:
        rows = list(csv.DictReader(f))
    ce = [r for r in rows if r["configuration"] == "CE"]
    ens = next(r for r in ce if r["predictor"] == "ensemble of 3 + T (pooled)")
    for r in ce:
        if r["predictor"] == "single + T":
            print(f"CE seed {r['seed']} + T: ECE {float(r['ECE']):.4f} NLL {float(r['NLL']):.4f}; ensemble + T "
                  f"(pooled): ECE {float(ens['ECE']):.4f} NLL {float(ens['NLL']):.4f}")
    mc = json.loads((RESULTS / "uncertainty_study" / "ce" / "mc10_seed0" / "summary.json").read_text())
    fit = mc["posthoc"]["temperature"]["params"]
    print(f"CE MC dropout (10) + T: T = {fit['temperature']:.4g}, fitted NLL {fit['nll_after']:.7f}, "
          f"ln 3 = {math.log(3):.7f}, test NLL {mc['posthoc']['temperature']['mean_nll']:.7f}")
    ensembles = [r for r in rows if r["predictor"] == "ensemble of 3"]
    print("ensembles' AUROC MI: " + ", ".join(f"{r['configuration']} {float(r['AUROC MI']):.4f}" for r in ensembles))
    for config in ("ce", "ce_dice", "focal", "ls", "margin3"):
        piece = json.loads((RESULTS / "uncertainty_study" / config / "piece.json").read_text())
        seed0 = piece["seed0_against_published"]
        print(f"{config}: seed 0 Dice now {seed0['now']['Dice']:.4f}, published {seed0['published']['Dice']:.4f}; "
              f"training seconds {piece['training_seconds']}, evaluation seconds "
              f"{sum(piece['evaluation_seconds'].values()):.0f}")


def main() -> int:
    print("\n".join(multirater_table()))
    multirater_checks()
    shift_checks()
    uncertainty_checks()
    seed_spread_checks()
    posthoc_checks()
    conformal_temperature_checks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

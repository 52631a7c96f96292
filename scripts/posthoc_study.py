"""Compare post-hoc calibration methods on trained runs, without touching the runs (issue #14, item 4).

For each run under the given directories (a sweep, or single runs), the selected checkpoint
(``checkpoints/best.pt``) is calibrated on the run's own validation split by every variant below,
and the run's test split is evaluated once, with the raw outputs and every variant in the same pass
(the evaluator and protocol of the run itself: its ``evaluation`` node).

========================  ================  ======================  =========
variant                   scaler            fitted on               objective
========================  ================  ======================  =========
temperature-balanced      temperature       balanced voxels         NLL
temperature-all           temperature       every voxel             NLL
temperature-region        temperature       the ECE region          NLL
temperature-region-ece    temperature       the ECE region          ECE
vector-balanced           vector            balanced voxels         NLL
vector-region             vector            the ECE region          NLL
lts                       LTS               whole cases (patches)   NLL
lts-image                 LTS (+ image)     whole cases (patches)   NLL
========================  ================  ======================  =========

and every other scaler of ``SCALER_TYPES`` under its own name (issue #45: Fiducio's calibrators, histogram binning,
isotonic regression), fitted by NLL on the region when it keeps the arg-max and on the balanced voxels when it may
move it. The figures are the evaluation's post-hoc figures (``shown_in("posthoc")`` of the table of figures), with
the change of Dice and HD95 against the raw outputs and in how many runs both stayed exactly as they were.

The fits go to ``<out>/runs/<run>/fits/<voxels>-<objective>/calibration.json`` (LTS weights beside),
the evaluation to ``<out>/runs/<run>/`` (``summary.json``, ``<variant>/summary.json``; a run studied
before with every variant asked for is read from there, so a study resumes); the tables to
``<out>/per_run.csv`` and ``<out>/table.md``: per loss configuration and variant, mean ± std over
seeds of the test metrics, and in how many runs the variant lowered the raw ECE / classwise ECE.

    python scripts/posthoc_study.py outputs/posthoc_study --out docs/results/posthoc_study
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from mcseg.calibration import PosthocConfig, fit_posthoc, scalers_to_apply  # noqa: E402
from mcseg.calibration.scaler_registry import SCALER_TYPES  # noqa: E402
from mcseg.evaluation.figure_table import shown_in  # noqa: E402
from mcseg.config import EvalProtocol, InferenceConfig, typed  # noqa: E402
from mcseg.inference.build import build_predictor, load_checkpoint, restore_model  # noqa: E402
from mcseg.evaluation.checkpoint import SELECTED, own_splits  # noqa: E402
from mcseg.data.build import build_dataset  # noqa: E402
from mcseg.evaluation.predictor import Evaluation, Member, Outputs, PosthocPlan, evaluate_predictor  # noqa: E402
from mcseg.environment import environment_record  # noqa: E402
from mcseg.evaluation.provenance import checkpoint_identity  # noqa: E402
from mcseg.runtime import resolve_device  # noqa: E402
from mcseg.rundir import find_run_dirs  # noqa: E402

log = logging.getLogger("posthoc_study")

# variant -> (scaler, posthoc.voxels, posthoc.objective, posthoc.lts overrides)
VARIANTS = {
    "temperature-balanced": ("temperature", "balanced", "nll", {}),
    "temperature-all": ("temperature", "all", "nll", {}),
    "temperature-region": ("temperature", "region", "nll", {}),
    "temperature-region-ece": ("temperature", "region", "ece", {}),
    "vector-balanced": ("vector", "balanced", "nll", {}),
    "vector-region": ("vector", "region", "nll", {}),
    "lts": ("lts", "balanced", "nll", {}),
    "lts-image": ("lts", "balanced", "nll", {"use_image": True}),
}
# Every other scaler mcseg offers (issue #45: Fiducio's calibrators, histogram binning, isotonic regression) is a
# variant under its own name, fitted by NLL where it is scored (the region) when it keeps the arg-max, and on the
# balanced voxels when it may move it (posthoc.voxels=region is refused for those: the region would move).
VARIANTS.update({name: (name, "region" if scaler.preserves_argmax else "balanced", "nll", {})
                 for name, scaler in SCALER_TYPES.items()
                 if name not in {v[0] for v in VARIANTS.values()} and scaler.fitted_on == "voxels"})
# the figures of the post-hoc comparison, from the evaluation's table of figures (mcseg/evaluation/figure_table.py)
METRICS = tuple(f.summary_key for f in shown_in("posthoc"))
SHORT = {f.summary_key: f.label for f in shown_in("posthoc")}
# the segmentation figures whose change against the raw outputs the table shows (0 for a calibrator keeping the arg-max)
CHANGES = ("mean_foreground_dice", "mean_foreground_hd95_mm")


def configuration(run_dir: Path) -> tuple[str, str]:
    """(configuration, seed) of a run: its command-line overrides (``.hydra/overrides.yaml``) without
    the seed and the ``posthoc.*`` keys (this study replaces those), and its seed."""
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    if overrides_file.is_file():
        overrides = [str(o) for o in OmegaConf.load(overrides_file)]
    else:  # a committed piece (no run folder): a multirun job's name, "<job number>_<overrides joined by commas>"
        job = re.fullmatch(r"\d+_(.+)", run_dir.name)
        overrides = job.group(1).split(",") if job else []
    seed = next((o.split("=", 1)[1] for o in overrides if o.startswith("seed=")), "")
    rest = [o for o in overrides if not o.startswith(("seed=", "posthoc.", "hydra", "experiment="))]
    return ",".join(rest) or run_dir.name, seed


def fit_groups(variants: list[str]) -> dict[tuple[str, str, str], list[str]]:
    """Variants that share one fit (same voxels, objective and LTS settings), so each group is one
    ``fit_posthoc`` call; an LTS variant with its own settings is a group of its own."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for name in variants:
        scaler, voxels, objective, lts = VARIANTS[name]
        key = (voxels, objective, json.dumps(lts, sort_keys=True))
        groups.setdefault(key, []).append(name)
    return groups


def study_run(run_dir: Path, out: Path, variants: list[str], device: str) -> dict:
    """Fit every variant on ``run_dir``'s validation split and evaluate its test split; the summary."""
    start_run = time.perf_counter()
    ckpt = run_dir / "checkpoints" / SELECTED
    state = load_checkpoint(ckpt)
    run_cfg = OmegaConf.create(state["config"])
    torch_device = resolve_device(device)
    model, loss_fn = restore_model(run_cfg, state, ckpt, torch_device)
    inference = typed(run_cfg.inference, InferenceConfig, "inference")
    protocol = typed(run_cfg.evaluation, EvalProtocol, "evaluation")
    predictor = build_predictor(run_cfg, model, loss_fn, torch_device, inference, run_cfg.trainer.precision)
    dataset = build_dataset(run_cfg.dataset)
    split = json.loads((run_dir / "split.json").read_text())
    splits = own_splits(ckpt, dataset, split)
    dataset.prepare(splits["val"])
    val_cases = [dataset.load(ref) for ref in splits["val"]]
    checkpoint = {**checkpoint_identity(ckpt, state), "selected": True}
    base = typed(run_cfg.get("posthoc"), PosthocConfig, "posthoc")

    scalers, seconds = {}, {}
    for (voxels, objective, lts), names in fit_groups(variants).items():
        types = sorted({VARIANTS[n][0] for n in names})
        cfg = replace(base, fit=types, apply=types, voxels=voxels, objective=objective,
                      lts={**base.lts, **json.loads(lts)})
        where = out / "fits" / (f"{voxels}-{objective}" + ("-" + "-".join(f"{k}={v}" for k, v in json.loads(lts).items())
                                                          if lts != "{}" else ""))
        where.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        record = fit_posthoc(predictor, iter(val_cases), cfg, where, checkpoint, {"study": str(run_dir)}, protocol)
        took = time.perf_counter() - start
        fitted = scalers_to_apply(record, types, where)
        for name in names:
            scalers[name] = fitted[VARIANTS[name][0]]
            seconds[name] = took / len(names)
    scalers = {name: scalers[name] for name in variants}  # the order asked for
    # the one evaluation of a predictor (mcseg/evaluation/predictor.py), with the scalers fitted above
    member = Member(predictor, checkpoint, out)
    evaluation = Evaluation(
        predictor, [member], member, dataset, splits["test"], "test", str(run_dir / "split.json"),
        [r.case_id for r in splits["all"]], out,
        {"study": "scripts/posthoc_study.py", "run_dir": str(run_dir), "checkpoint": checkpoint}, state, run_cfg,
        ckpt, split, dataset, "test", [], environment_record(torch_device, bool(run_cfg.trainer.get("deterministic"))),
        checkpoint["sha256"], f"{run_dir.name}, every post-hoc variant")
    summary = evaluate_predictor(evaluation, [PosthocPlan(scalers)], protocol, Outputs(False, False))
    summary["fit_seconds"] = seconds
    summary["wall_seconds"] = time.perf_counter() - start_run
    (out / "timing.json").write_text(json.dumps({"fit": seconds, "wall": summary["wall_seconds"]}))
    return summary


def earlier_result(out: Path, variants: list[str]) -> dict | None:
    """The summary of an earlier study of this run in ``out`` holding every variant (a study resumes)."""
    try:
        summary = json.loads((out / "summary.json").read_text())
        timing = json.loads((out / "timing.json").read_text())
        summary["fit_seconds"], summary["wall_seconds"] = timing["fit"], timing["wall"]
    except (OSError, json.JSONDecodeError):
        return None
    return summary if set(variants) <= set(summary.get("posthoc", {})) else None


def rows_of(run_dir: Path, summary: dict) -> list[dict]:
    config, seed = configuration(run_dir)
    rows = [{"configuration": config, "seed": seed, "variant": "raw (pre_T)", "label": "none",
             "temperature": "", "fit_s": "", "voxels_changed": "", **{k: summary.get(k) for k in METRICS}}]
    for name, entry in summary.get("posthoc", {}).items():
        params = entry.get("params") or {}
        changed = (entry.get("segmentation") or {}).get("fraction_changed")
        rows.append({"configuration": config, "seed": seed, "variant": name, "label": entry.get("label", name),
                     "temperature": params.get("temperature", ""),
                     # the fit's own wall seconds (recorded for every scaler since issue #45; before, Fiducio's only)
                     "fit_s": params.get("fit_seconds", ""),
                     "voxels_changed": changed if changed is not None else "",
                     **{k: entry.get(k) for k in METRICS}})
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: per configuration and variant, mean ± std over seeds; the change of Dice and HD95 against the
    raw outputs (and in how many runs both stayed exactly as they were: the segmentation kept); wins against the
    raw outputs on ECE and classwise ECE; fit seconds."""
    def cell(values):
        values = [float(v) for v in values if v not in (None, "")]
        if not values:
            return ""
        return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 \
            else f"{values[0]:.3f}"

    raw = {(r["configuration"], r["seed"]): r for r in rows if r["variant"] == "raw (pre_T)"}

    def change(r, m):
        base = raw[(r["configuration"], r["seed"])][m]
        return "" if r[m] in (None, "") or base in (None, "") else float(r[m]) - float(base)

    configs = list(dict.fromkeys(r["configuration"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    head = ["configuration", "variant", "T", *(SHORT[m] for m in METRICS), *(f"Δ {SHORT[m]}" for m in CHANGES),
            "segmentation kept", "voxels changed", "ECE lower", "CECE lower", "fit s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scope in [*configs, "all"]:
        for variant in variants:
            sel = [r for r in rows if r["variant"] == variant and scope in ("all", r["configuration"])]
            if not sel:
                continue
            if variant == "raw (pre_T)":
                derived = [""] * (len(CHANGES) + 5)
            else:
                kept = sum(all(r[m] == raw[(r["configuration"], r["seed"])][m] for m in CHANGES) for r in sel)
                wins = [sum(float(r[m]) < float(raw[(r["configuration"], r["seed"])][m]) for r in sel)
                        for m in ("mean_ece", "mean_classwise_ece")]
                shares = [100 * float(r["voxels_changed"]) for r in sel if r["voxels_changed"] != ""]
                derived = [*(cell(change(r, m) for r in sel) for m in CHANGES), f"{kept}/{len(sel)}",
                           f"{statistics.fmean(shares):.2f}%" if shares else "",
                           *(f"{w}/{len(sel)}" for w in wins), cell(r["fit_s"] for r in sel)]
            lines.append("| " + " | ".join([scope if scope != "all" else f"**all {len(sel)} runs**", variant,
                                            cell(r["temperature"] for r in sel),
                                            *(cell(r[m] for r in sel) for m in METRICS), *derived]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path, help="sweep or run directories (runs with checkpoints/best.pt)")
    parser.add_argument("--out", type=Path, required=True, help="where the fits, evaluations and tables go")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                        help="default: every variant (with --pieces: those each piece holds)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pieces", action="store_true",
                        help="the roots are earlier --out folders (committed pieces, runs/<run>/summary.json and "
                             "timing.json): write the table of all of them into --out, without the run folders")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.pieces:
        return write_tables(args.out, [r for root in args.roots for r in sorted((root / "runs").iterdir())
                                       if (r / "summary.json").is_file()], args.variants, args.device, pieces=True)
    args.variants = args.variants or list(VARIANTS)
    runs = [r for r in find_run_dirs(args.roots) if (r / "checkpoints" / SELECTED).is_file()]
    if not runs:
        print(f"no run with checkpoints/{SELECTED} under {', '.join(map(str, args.roots))}", file=sys.stderr)
        return 2
    return write_tables(args.out, runs, args.variants, args.device)


def write_tables(out: Path, runs: list[Path], variants: list[str] | None, device: str, pieces: bool = False) -> int:
    """Study each run (or, with ``pieces``, read each committed piece's run folder) and write per_run.csv and
    table.md into ``out``; ``variants`` None (pieces only): those each piece holds."""
    rows, wall = [], 0.0
    for run_dir in runs:
        name = re.sub(r"[^\w.,=+-]", "_", run_dir.name)
        where = run_dir if pieces else out / "runs" / name
        if variants is None:
            variants = list(json.loads((where / "summary.json").read_text()).get("posthoc", {}))
        summary = earlier_result(where, variants)
        if summary is None and pieces:
            print(f"{run_dir}: no study of every variant asked for ({', '.join(variants)})", file=sys.stderr)
            return 2
        if summary is None:
            summary = study_run(run_dir, out / "runs" / name, variants, device)
            log.info("%s: %.0f s", run_dir.name, summary["wall_seconds"])
        else:
            log.info("%s: studied before, read from %s", run_dir.name, run_dir if pieces else out / "runs" / name)
            summary["posthoc"] = {v: summary["posthoc"][v] for v in variants}
        rows.extend(rows_of(run_dir, summary))
        wall += summary["wall_seconds"]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "per_run.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    minutes = wall / 60
    (out / "table.md").write_text(
        f"Test split, {len(runs)} runs, {minutes:.1f} min of wall time for the fits and evaluations (the sum over runs) "
        f"(device {device}).\n\n" + table(rows))
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

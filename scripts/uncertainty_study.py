"""Uncertainty compared (issue #23): one network, its temperature, the seeds' deep ensemble, TTA and MC dropout.

    python scripts/uncertainty_study.py <sweep of seeds> [--dropout <sweep of dropout-trained runs>] \\
        [--tta-seeds 0] [--mc-samples 8] [--seeds 3] --out docs/results/uncertainty_study

For each configuration (runs grouped by ``run.configuration_sha256`` of their ``result.json``) of the seeds'
sweep: the single networks as trained (``eval/test``: raw, and after the run's temperature), the deep ensemble
of its seeds (``evaluate.py ckpt=[...]``: probabilities pooled, temperature fitted on the pooled validation
prediction; and ``posthoc.pool=after``: each network scaled by its own temperature, then pooled), and TTA
with every flip combination of the networks of ``--tta-seeds`` (temperature fitted on
their pooled validation prediction); for each run of the dropout sweep (one per loss, trained with
``model.dropout``): the network alone and ``--mc-samples`` MC-dropout passes. Every evaluation is mcseg's own
(``mcseg.evaluation``), written where ``evaluate.py`` writes it; one that exists is read back, so the study
resumes. Nothing is selected on the test split. Writes ``<out>/table.md`` and ``<out>/per_evaluation.csv``.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

from mcseg.config import CONFIG_DIR  # noqa: E402
from mcseg.evaluation.checkpoint import evaluate_checkpoint  # noqa: E402
from mcseg.evaluation.ensemble import evaluate_ensemble  # noqa: E402
from mcseg.rundir import find_run_dirs  # noqa: E402

log = logging.getLogger("uncertainty_study")

# (column, how it is read from a summary.json; None: not measured)
COLUMNS = {
    "Dice": lambda s: s.get("mean_foreground_dice"),
    "HD95": lambda s: s.get("mean_foreground_hd95_mm"),
    "ECE": lambda s: s.get("mean_ece"),
    "CECE": lambda s: s.get("mean_classwise_ece"),
    "NLL": lambda s: s.get("mean_nll"),
    "Brier": lambda s: s.get("mean_brier"),
    "AURC": lambda s: _fd(s, "predictive_entropy", "image", "aurc"),
    "E-AURC": lambda s: _fd(s, "predictive_entropy", "image", "eaurc"),
    "AUGRC": lambda s: _fd(s, "predictive_entropy", "image", "augrc"),
    "UEO": lambda s: _fd(s, "predictive_entropy", "ueo"),
    "AUROC": lambda s: _fd(s, "predictive_entropy", "voxel_auroc_pooled"),
    "AUROC MI": lambda s: _fd(s, "mutual_information", "voxel_auroc_pooled"),
}


def _fd(summary: dict, *keys):
    node = summary.get("failure_detection")
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="evaluate", overrides=overrides)


def _evaluate(kind: str, target, overrides: list[str]) -> tuple[dict, float]:
    """An evaluation (read back when it exists) and its wall time (0 when read back)."""
    cfg = _cfg(["save_predictions=false", "evaluation.bootstrap_samples=200", *overrides])
    start = time.perf_counter()
    try:
        summary = evaluate_ensemble(cfg, target, overrides) if kind == "ensemble" else \
            evaluate_checkpoint(cfg, target, overrides)
    except FileExistsError as exc:  # evaluated before: read back; any other refusal is the user's to read
        path, sep, _ = str(exc).partition(" exists (an earlier evaluation")
        if not sep or not Path(path).is_file():
            raise
        return json.loads(Path(path).read_text()), 0.0
    return summary, time.perf_counter() - start


def _groups(sweep: Path) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = {}
    for run in find_run_dirs([sweep]):
        result = run / "result.json"
        if not result.is_file():
            log.warning("%s: not finished (no result.json); left out", run)
            continue
        identity = json.loads(result.read_text())["run"]
        groups.setdefault(identity["configuration"], []).append(run)
    return {k: sorted(v, key=lambda r: json.loads((r / "result.json").read_text())["run"]["seed"])
            for k, v in groups.items()}


def _rows(label: str, predictor: str, summaries: list[dict], seconds: float) -> list[dict]:
    rows = [{"configuration": label, "predictor": predictor, "seconds": seconds,
             **{c: read(s) for c, read in COLUMNS.items()}} for s in summaries]
    return rows


def _scaled(summary: dict) -> dict | None:
    after = (summary.get("posthoc") or {}).get("temperature")
    return None if after is None else {"mean_foreground_dice": after.get("mean_foreground_dice"),
                                       "mean_foreground_hd95_mm": after.get("mean_foreground_hd95_mm"),
                                       "mean_ece": after.get("mean_ece"),
                                       "mean_classwise_ece": after.get("mean_classwise_ece"),
                                       "mean_nll": after.get("mean_nll"), "mean_brier": after.get("mean_brier")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--dropout", type=Path, default=None)
    parser.add_argument("--tta-seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--mc-samples", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=None,
                        help="leave out configurations with fewer finished runs (a study still training: its "
                             "ensembles are made of all the seeds, or not yet)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows: list[dict] = []
    for label, runs in _groups(args.sweep).items():
        if args.seeds is not None and len(runs) < args.seeds:
            log.warning("%s: %d of %d runs finished; left out", label, len(runs), args.seeds)
            continue
        singles = [json.loads((r / "eval/test/summary.json").read_text()) for r in runs]
        rows += _rows(label, "single", singles, 0.0)
        rows += _rows(label, "single + T", [s for s in map(_scaled, singles) if s], 0.0)
        if len(runs) > 1:
            ensemble, seconds = _evaluate("ensemble", [str(r) for r in runs], ["posthoc.apply=[temperature]"])
            rows += _rows(label, f"ensemble of {len(runs)}", [ensemble], seconds)
            rows += _rows(label, f"ensemble of {len(runs)} + T (pooled)", [s for s in [_scaled(ensemble)] if s], 0.0)
            after, seconds = _evaluate("ensemble", [str(r) for r in runs],
                                       ["posthoc.apply=[temperature]", "posthoc.pool=after"])
            rows += _rows(label, f"ensemble of {len(runs)} + T (each network's, then pooled)",
                          [s for s in [_scaled(after)] if s], seconds)
        for run in runs:
            if json.loads((run / "result.json").read_text())["run"]["seed"] not in args.tta_seeds:
                continue
            tta, seconds = _evaluate("single", run / "checkpoints/best.pt", ["tta=[flips]"])
            rows += _rows(label, "TTA (flips)", [tta], seconds)
            rows += _rows(label, "TTA (flips) + T (pooled)", [s for s in [_scaled(tta)] if s], 0.0)
    if args.dropout is not None:
        for label, runs in _groups(args.dropout).items():
            for run in runs:
                alone = json.loads((run / "eval/test/summary.json").read_text())
                rows += _rows(label, "dropout net, one pass", [alone], 0.0)
                mc, seconds = _evaluate("single", run / "checkpoints/best.pt", [f"mc_samples={args.mc_samples}"])
                rows += _rows(label, f"MC dropout ({args.mc_samples})", [mc], seconds)
                rows += _rows(label, f"MC dropout ({args.mc_samples}) + T (pooled)",
                              [s for s in [_scaled(mc)] if s], 0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "per_evaluation.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["configuration", "predictor", "seconds", *COLUMNS])
        writer.writeheader()
        writer.writerows(rows)
    (args.out / "table.md").write_text(table(rows))
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    """Per configuration and predictor: mean ± std over the evaluations (seeds) of each column."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["configuration"], row["predictor"]), []).append(row)
    lines = ["| configuration | predictor | n | " + " | ".join(COLUMNS) + " | eval. s |",
             "|---|---|---|" + "---|" * (len(COLUMNS) + 1)]
    for (label, predictor), members in groups.items():
        cells = []
        for column in COLUMNS:
            values = [m[column] for m in members if m[column] is not None]
            digits = 2 if column == "HD95" else 3
            if not values:
                cells.append("–")
            elif len(values) == 1:
                cells.append(f"{values[0]:.{digits}f}")
            else:
                cells.append(f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}")
        seconds = sum(m["seconds"] for m in members)
        lines.append(f"| {label} | {predictor} | {len(members)} | " + " | ".join(cells)
                     + f" | {seconds:.0f} |" if seconds else f"| {label} | {predictor} | {len(members)} | "
                     + " | ".join(cells) + " | – |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

"""The table of the simulated multi-rater study (issue #37) from its committed pieces: every evaluation against the
majority label, each rater and the rater mean (``raters_table.md``, written by :func:`study_tables.assemble`)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import study_presets  # noqa: E402
from study_presets import ONE_RATER, pieces  # noqa: E402


RATER_COLUMNS = {  # the multi-rater table: column -> (where in summary["raters"], format)
    "Dice vs raters": (("foreground", "dice_rater_mean"), "{:.3f}"),
    "consensus Dice": (("foreground", "consensus_dice"), "{:.3f}"),
    "QUBIQ Dice": (("foreground", "thresholded_dice"), "{:.3f}"),
    "ECE vs rater mean": (("case", "ece_mean"), "{:.4f}"),
    "CECE vs rater mean": (("case", "classwise_ece_mean"), "{:.4f}"),
    "NLL vs rater mean": (("case", "nll_mean"), "{:.4f}"),
    "ECE vs each rater (CURVAS, mean)": (("case", "ece_curvas_rater_mean"), "{:.4f}"),
    "volume CRPS (mL)": (("foreground", "volume_crps"), "{:.4f}"),
    "GED": (("case", "ged"), "{:.3f}"),
    "HM-IoU": (("case", "hm_iou"), "{:.3f}"),
}


NOT_SCORED = "not scored"
MAJORITY_TARGETS = ("majority", "mean", "random")  # targets whose hard label is the raters' majority vote
# (mcseg.data.raters.hard_label); a rater's name makes that rater the hard label instead


def rater_target(piece: dict) -> str:
    """The ``dataset.raters.target`` a configuration was trained with (its piece's overrides; default majority)."""
    for override in piece.get("overrides", []):
        if override.startswith("dataset.raters.target="):
            return override.split("=", 1)[1]
    return "majority"


def rater_names(summaries: list[dict]) -> list[str]:
    """The raters of the evaluations, in the order they first appear."""
    names: list[str] = []
    for summary in summaries:
        for name in ((summary.get("raters") or {}).get("per_rater") or {}):
            if name not in names:
                names.append(name)
    return names


def rater_table(study_names: tuple[str, ...] = ("multirater", "multirater_ensembles")) -> str:
    """The multi-rater figures of every committed evaluation of the simulated study, one row per network or
    ensemble, every row against the same references: the majority label (the evaluation's hard label, so only for
    the targets whose hard label is the majority vote; a network trained on one rater was scored against that
    rater and shows "not scored" here), each rater (per_rater: Dice, and the CURVAS ECE of rater ``original``)
    and the rater mean (the ``raters`` part of each summary.json)."""
    found = []  # (piece, slug, summary)
    seen = set()
    for study_name in study_names:
        for config, piece in pieces(study_name).items():
            for summary_path in sorted((study_presets.results_dir(study_name) / config).glob("*/summary.json")):
                slug = summary_path.parent.name
                if (config, slug) in seen:  # seed 0 of the ensembles' study is the multirater run
                    continue
                seen.add((config, slug))
                found.append((piece, slug, json.loads(summary_path.read_text())))
    names = rater_names([summary for _, _, summary in found])
    head = ["configuration", "predictor", "hard label", "Dice (majority label)", "ECE (majority label)",
            *(f"Dice vs {name}" for name in names), f"ECE vs {ONE_RATER} (CURVAS)", *RATER_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for piece, slug, summary in found:
        target = rater_target(piece)
        raters = summary.get("raters") or {}
        per_rater = raters.get("per_rater") or {}
        majority = target in MAJORITY_TARGETS
        cells = [piece["label"], slug.replace("_", " "), "majority" if majority else target,
                 f"{summary.get('mean_foreground_dice', math.nan):.3f}" if majority else NOT_SCORED,
                 f"{summary.get('mean_ece', math.nan):.4f}" if majority else NOT_SCORED,
                 *(f"{per_rater.get(name, {}).get('mean_foreground_dice', math.nan):.3f}" for name in names),
                 f"{per_rater.get(ONE_RATER, {}).get('ece_curvas', math.nan):.4f}"]
        for (part, key), form in RATER_COLUMNS.values():
            value = ((raters.get(part) or {}).get(key) or {}).get("mean", math.nan)
            cells.append("-" if value is None or value != value else form.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

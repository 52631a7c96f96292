"""Evaluate a split with a trained model: per-case files, a summary and its plain-text table.

Used by training (the test split of ``best.pt``) and by the re-evaluation of a saved checkpoint
(:mod:`mcseg.evaluation.checkpoint`).
"""
from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import torch
from tqdm import tqdm

from mcseg.calibration import CALIBRATION_FILE, SCALER_TYPES, Scaler
from mcseg.data.cases import CaseData, CaseRef
from mcseg.data.base import SegmentationDataset
from mcseg.files import write_csv, write_json
from mcseg.evaluation.evaluator import Evaluator
from mcseg.config import EvalProtocol
from mcseg.evaluation.cases import ArgmaxChanges, PerNetwork, evaluate_cases, failure_detection
from mcseg.evaluation.raters import RELIABILITY_FILE as RATER_RELIABILITY
from mcseg.inference.predict import SegmentationPredictor
from mcseg.evaluation.figure_table import shown_in, summary_value

from mcseg.text import plural

log = logging.getLogger(__name__)
PROVENANCE_FILE = "provenance.json"
FAILURE_FILE = "failure_per_case.csv"


def evaluate_split(
    predictor: SegmentationPredictor, dataset: SegmentationDataset, refs: list[CaseRef], protocol: EvalProtocol,
    out_dir: Path, save_predictions: bool, save_probabilities: bool, scalers: dict[str, Scaler] | None = None,
    provenance: dict | None = None, progress: bool = True, per_network: dict[str, list[Scaler]] | None = None,
) -> dict:
    """Segment ``refs`` one case at a time and write per_case.csv, summary.json and diagrams to ``out_dir``.

    Each post-hoc scaler in ``scalers`` (name -> fitted :class:`~mcseg.calibration.Scaler`, moved to the
    predictor's device) is evaluated in the same pass; its files go to ``out_dir/<name>/`` and its
    headline values, with how it was fitted, to ``summary["posthoc"]``. ``per_network`` (``posthoc.pool=after``):
    per scaler name, each network's own fitted scaler, applied to its members before they are pooled.
    ``provenance`` (what produced these numbers: :mod:`mcseg.evaluation.provenance`) goes into every
    summary.json and into ``out_dir/provenance.json``, the sidecar of per_case.csv and the predictions.
    """
    if not refs:
        raise ValueError(f"dataset {dataset.name}: the split to evaluate has no cases")

    with_raters = any(r.raters for r in refs)  # cases with several raters: the figures against them too

    def new_evaluator() -> Evaluator:
        return Evaluator(dataset.num_classes, dataset.class_names, protocol, predictor.multilabel, with_raters)

    evaluator = new_evaluator()
    if provenance is not None:  # how the logits were made: windows, blending, test-time mirroring
        cfg = predictor.cfg
        provenance = {**provenance, "inference": {"overlap": cfg.overlap, "blend_mode": cfg.blend_mode,
                                                  "mirror_axes": list(cfg.mirror_axes),
                                                  "mc_samples": cfg.mc_samples, "tta": list(cfg.tta),
                                                  "tta_noise_std": cfg.tta_noise_std,
                                                  "member_seed": cfg.member_seed, "members": predictor.n_members}}
    origin = {"provenance": provenance} if provenance is not None else {}
    posthoc = {name: (_transform(scaler.to(predictor.device)), new_evaluator(), scaler.preserves_argmax)
               for name, scaler in (scalers or {}).items()}
    # each network scaled before pooling: the pooled arg-max can move, so it is scored as it comes out
    posthoc.update({name: (PerNetwork([_transform(s.to(predictor.device)) for s in fits]), new_evaluator(), False)
                    for name, fits in (per_network or {}).items()})
    described = {name: fits[0] for name, fits in (per_network or {}).items()}
    dataset.prepare(refs)
    failure = failure_detection(protocol)
    changes = ArgmaxChanges(predictor.multilabel)
    cases = (dataset.load(ref) for ref in tqdm(refs, desc=f"evaluating {len(refs)} cases", leave=False,
                                                dynamic_ncols=True, disable=not progress))  # one in memory at a time
    evaluate_cases(predictor, cases, evaluator, dataset.restore, out_dir, save_predictions, save_probabilities,
                   protocol.save_uncertainty, posthoc=posthoc, failure=failure, restore_maps=dataset.restore_maps,
                   raters=dataset.original_raters if with_raters else None,
                   rater_image=raw_ct(dataset) if protocol.rater_crop == "curvas2024" else None, changes=changes)
    after = {}
    raw = evaluator.summary() if posthoc else {}
    for name, (_, scaled_evaluator, _) in posthoc.items():
        if name in described:  # pooled after: each network's own fit
            fits = per_network[name]
            fitted = {"label": f"{described[name].label()}, each network's own, pooled after",
                      "description": f"{described[name].describe()} (each network's own fit, applied before pooling)",
                      "params": [f.record for f in fits], "pool": "after"}
        else:
            fitted = {"label": scalers[name].label(), "description": scalers[name].describe(),
                      "params": scalers[name].record, **({"pool": "before"} if predictor.pooled else {})}
        scaled = scaled_evaluator.write(out_dir / name, extra={"posthoc": {"scaler": name, **fitted}, **origin})
        # each scaler's figures of the table of figures' "posthoc", and those pooled over the voxels
        after[name] = {**fitted, **{f.summary_key: scaled.get(f.summary_key) for f in shown_in("posthoc")},
                       "pooled": {f.key: scaled["pooled"].get(f.key) for f in shown_in("posthoc") if f.pooled},
                       "segmentation": segmentation_change(raw, scaled, changes.counts.get(name, {}), posthoc[name][2])}
    members = {"members": predictor.n_members, "pooled": "probabilities"} if predictor.pooled else {}
    detection = {"failure_detection": failure.summary()} if failure is not None else {}
    summary = evaluator.write(out_dir, extra={**({"posthoc": after} if after else {}), **origin, **detection,
                                              **({"predictor": members} if members else {})})
    if failure is not None and failure.rows:  # the cases behind the risk-coverage curves (mcseg-report draws them)
        write_csv(out_dir / FAILURE_FILE, failure.rows)
    if provenance is not None:
        write_json(out_dir / PROVENANCE_FILE, provenance)
    log.info("evaluation of %s written to %s", plural(len(refs), "case"), out_dir)
    return summary


def segmentation_change(raw: dict, scaled: dict, counted: dict, keeps_argmax: bool) -> dict:
    """How a post-hoc scaler changed the segmentation (``summary.posthoc.<name>.segmentation``): the scored voxels
    whose arg-max it moved (``counted``: :class:`~mcseg.evaluation.cases.ArgmaxChanges`), which prediction its
    segmentation figures score (``raw`` for a scaler that keeps the arg-max: float32 can still round a near-tie
    the other way, counted here), and per segmentation figure of the post-hoc block (the table of figures) its
    value minus the raw one. ``changed``: the scored segmentation differs from the raw one."""
    differences = {}
    for f in shown_in("posthoc"):
        if f.kind == "segmentation":
            after, before = summary_value(scaled, f), summary_value(raw, f)
            differences[f.summary_key] = None if after is None or before is None else after - before
    scored = "raw" if keeps_argmax else "calibrated"
    moved = any(d is not None and not math.isnan(d) and d != 0 for d in differences.values())
    changed = scored == "calibrated" and (counted.get("voxels_changed", 0) > 0 or moved)
    return {"changed": changed, "scored_prediction": scored, **counted,
            "fraction_changed": counted["voxels_changed"] / counted["voxels"] if counted.get("voxels") else None,
            "difference": differences}


def segmentation_text(change: dict | None) -> str:
    """:func:`segmentation_change` in a phrase: ``kept``, ``kept (the arg-max of 3 voxels rounded otherwise in
    float32; ...)`` or ``changed: 1.2% of voxels, 2/3 cases``; '?' for an evaluation without it."""
    if not change:
        return "?"
    n, fraction = change.get("voxels_changed", 0), change.get("fraction_changed") or 0.0
    if not change.get("changed"):
        return "kept" + (f" (the arg-max of {plural(n, 'voxel')} rounded otherwise in float32; the raw prediction "
                         f"is scored)" if n else "")
    return f"changed: {100 * fraction:.3g}% of voxels, {change.get('cases_changed')}/{change.get('cases')} cases"


def _transform(scaler: Scaler):
    """``(logits, case) -> calibrated logits`` of one case (the image only for a scaler that uses it)."""
    def transform(logits: torch.Tensor, case: CaseData) -> torch.Tensor:
        image = torch.as_tensor(case.image, device=logits.device) if scaler.uses_image else None
        return scaler.apply(logits, image)
    return transform


def _fmt(value, digits: int = 4) -> str:
    return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def raw_ct(dataset: SegmentationDataset):
    """``case -> its first channel as read from disk`` (raw intensities, the file grid): CURVAS 2024's crop."""
    return lambda case: dataset.read(case.meta["ref"]).image[0]


def format_summary(summary: dict, class_names: list[str], title: str) -> str:
    """A plain-text table of per-class Dice and HD95 plus the case-level calibration means."""
    protocol = summary.get("protocol", {})
    lines = [f"== {title}: {plural(summary.get('n_cases') or 0, 'case')}; ECE region {protocol.get('region')}, "
             f"{protocol.get('n_bins')} bins, HD{protocol.get('hd_percentile', 95):g} in mm =="]
    lines.append(f"{'class':<16}{'Dice':>10}{'HD95 mm':>12}")
    per_class = summary.get("per_class", {})
    provenance = summary.get("provenance") or {}
    unseen = set(provenance.get("classes_unseen_in_training") or [])
    for name in class_names[1:] if not summary.get("multilabel") else class_names:
        entry = per_class.get(name, {})
        lines.append(f"{name:<16}{_fmt(entry.get('dice', {}).get('mean')):>10}"
                     f"{_fmt(entry.get('hd95_mm', {}).get('mean'), 2):>12}"
                     + ("   (no voxel of it in the training split)" if name in unseen else ""))
    lines.append(f"{'foreground mean':<16}{_fmt(summary.get('mean_foreground_dice')):>10}"
                 f"{_fmt(summary.get('mean_foreground_hd95_mm'), 2):>12}")
    pooled = summary.get("pooled", {})
    lines.append(f"ECE {_fmt(summary.get('mean_ece'))}   classwise ECE {_fmt(summary.get('mean_classwise_ece'))}"
                 f"   (means of per-case values)")
    lines.append(f"ECE {_fmt(pooled.get('ece'))}   classwise ECE {_fmt(pooled.get('classwise_ece'))}"
                 f"   (pooled over all voxels of the split)")
    raters = summary.get("raters")
    if raters:  # the figures against several raters, foreground means over cases (docs/protocol.md)
        fg, case, k = raters.get("foreground", {}), raters.get("case", {}), raters.get("raters_per_case") or {}
        mean = lambda part, key: _fmt((part.get(key) or {}).get("mean"))  # noqa: E731
        lines.append(f"against {k.get('min')}-{k.get('max')} raters: Dice per rater {mean(fg, 'dice_rater_mean')}   "
                     f"consensus Dice {mean(fg, 'consensus_dice')}   STAPLE Dice {mean(fg, 'staple_dice')}   "
                     f"thresholded Dice {mean(fg, 'thresholded_dice')}")
        lines.append(f"against the rater mean: ECE {mean(case, 'ece_mean')}   NLL {mean(case, 'nll_mean')}   "
                     f"Brier {mean(case, 'brier_mean')}   CURVAS ECE (mean over raters) "
                     f"{mean(case, 'ece_curvas_rater_mean')}   volume CRPS {mean(fg, 'volume_crps')} mL")
        if any(raters.get("n_samples") or []):
            lines.append(f"samples {raters.get('n_samples')}: GED {mean(case, 'ged')}   HM-IoU {mean(case, 'hm_iou')}")
    for part, hits in (provenance.get("seen_in_training") or {}).items():
        lines.append(f"WARNING: {plural(len(hits), 'scored case')} of this split have the content of the checkpoint's "
                     f"{part} cases ({', '.join(list(hits)[:3])}{' ...' if len(hits) > 3 else ''})")
    for name, after in summary.get("posthoc", {}).items():
        shown = after.get("description") or name
        lines.append(f"post-hoc {shown}: Dice {_fmt(after.get('mean_foreground_dice'))}   "
                     f"ECE {_fmt(after.get('mean_ece'))}   classwise ECE {_fmt(after.get('mean_classwise_ece'))}   "
                     f"NLL {_fmt(summary.get('mean_nll'))} -> {_fmt(after.get('mean_nll'))}   "
                     f"segmentation {segmentation_text(after.get('segmentation'))}")
    return "\n".join(lines)


def clear_evaluation(out: Path, refits: bool = True) -> None:
    """Remove an earlier evaluation's files from ``out`` (only the files an evaluation writes); ``refits``:
    also a post-hoc refit saved with it (:func:`mcseg.evaluation.predictor.plan_posthoc`)."""
    for name in ("summary.json", "per_case.csv", "per_case_raters.csv", "per_rater.csv", RATER_RELIABILITY,
                 "reliability.csv", "reliability.png", "reliability_histogram.csv", "reliability_histogram.png",
                 PROVENANCE_FILE, "split.json", FAILURE_FILE):
        (out / name).unlink(missing_ok=True)
    if refits:
        (out / CALIBRATION_FILE).unlink(missing_ok=True)
        for weights in [*out.glob("lts-*.pt"), *out.glob("fiducio-*.pt")]:  # files of LTS and Fiducio fits
            weights.unlink()
    for name in ("predictions", *SCALER_TYPES):
        if (out / name).is_dir():
            shutil.rmtree(out / name)

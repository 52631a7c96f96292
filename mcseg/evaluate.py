"""Evaluate a split with a trained model; ``evaluate(cfg)`` re-evaluates a saved checkpoint."""
from __future__ import annotations

import logging
import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mcseg.config import typed
from mcseg.data.base import SegmentationDataset
from mcseg.data.cases import CaseRef
from mcseg.engine.checkpoint import load_checkpoint, load_model_weights
from mcseg.engine.evaluator import EvalProtocol, Evaluator
from mcseg.engine.inference import InferenceConfig
from mcseg.engine.predict import SegmentationPredictor, evaluate_cases
from mcseg.runtime import resolve_device
from mcseg.targets import instantiate_checked

log = logging.getLogger(__name__)


def evaluate_split(
    predictor: SegmentationPredictor, dataset: SegmentationDataset, refs: list[CaseRef], protocol: EvalProtocol,
    out_dir: Path, save_predictions: bool, save_probabilities: bool,
) -> dict:
    """Segment ``refs`` one case at a time and write per_case.csv, summary.json and diagrams to ``out_dir``."""
    if not refs:
        raise ValueError(f"dataset {dataset.name}: the split to evaluate has no cases")
    evaluator = Evaluator(dataset.num_classes, dataset.class_names, protocol, predictor.multilabel)
    dataset.prepare(refs)
    cases = (dataset.load(ref) for ref in refs)  # one case in memory at a time
    evaluate_cases(predictor, cases, evaluator, dataset.restore, out_dir, save_predictions, save_probabilities, protocol.save_uncertainty)
    summary = evaluator.write(out_dir)
    log.info("evaluation of %d cases written to %s", len(refs), out_dir)
    return summary


def _fmt(value, digits: int = 4) -> str:
    return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def format_summary(summary: dict, class_names: list[str], title: str) -> str:
    """A plain-text table of per-class Dice and HD95 plus the case-level calibration means."""
    protocol = summary.get("protocol", {})
    lines = [f"== {title}: {summary.get('n_cases')} cases; ECE region {protocol.get('region')}, "
             f"{protocol.get('n_bins')} bins, HD{protocol.get('hd_percentile', 95):g} in mm =="]
    lines.append(f"{'class':<16}{'Dice':>10}{'HD95 mm':>12}")
    per_class = summary.get("per_class", {})
    for name in class_names[1:] if not summary.get("multilabel") else class_names:
        entry = per_class.get(name, {})
        lines.append(f"{name:<16}{_fmt(entry.get('dice', {}).get('mean')):>10}"
                     f"{_fmt(entry.get('hd95_mm', {}).get('mean'), 2):>12}")
    lines.append(f"{'foreground mean':<16}{_fmt(summary.get('mean_foreground_dice')):>10}"
                 f"{_fmt(summary.get('mean_foreground_hd95_mm'), 2):>12}")
    pooled = summary.get("pooled", {})
    lines.append(f"ECE {_fmt(summary.get('mean_ece'))}   classwise ECE {_fmt(summary.get('mean_classwise_ece'))}"
                 f"   (means of per-case values)")
    lines.append(f"ECE {_fmt(pooled.get('ece'))}   classwise ECE {_fmt(pooled.get('classwise_ece'))}"
                 f"   (pooled over all voxels of the split)")
    return "\n".join(lines)


def evaluate(cfg: DictConfig) -> dict:
    """Re-evaluate ``cfg.ckpt`` with the run's saved config; ``cfg.dataset`` replaces its dataset if given."""
    from mcseg.engine.data import build_dataset, record_dataset_facts, resolve_split
    from mcseg.train import build_predictor

    ckpt_path = Path(cfg.ckpt).expanduser().resolve()
    state = load_checkpoint(ckpt_path)
    run_cfg = OmegaConf.create(state["config"])
    run_dir = ckpt_path.parent.parent
    other_dataset = cfg.get("dataset") is not None
    if other_dataset:
        run_cfg.dataset = cfg.dataset
    device = resolve_device(cfg.device)
    dataset = build_dataset(run_cfg.dataset)
    record_dataset_facts(run_cfg, dataset)
    # Another dataset gets its own split.json in this job's directory; the run's own is reused otherwise.
    splits = resolve_split(dataset, run_cfg.dataset, Path(cfg.paths.output_dir) if other_dataset else run_dir)
    model = instantiate_checked(run_cfg.model, "model").to(device)
    load_model_weights(model, state["model"], ckpt_path)
    loss_fn = instantiate_checked(run_cfg.loss, "loss").to(device)
    loss_fn.load_state_dict(state.get("loss", {}))
    inference = typed(run_cfg.inference, InferenceConfig, "inference")
    protocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    predictor = build_predictor(run_cfg, model, loss_fn, device, inference, run_cfg.trainer.precision)
    if cfg.eval_dir:
        out_dir = Path(cfg.eval_dir)
    else:
        out_dir = run_dir / "eval" / (f"{dataset.name}-{cfg.split}" if other_dataset else str(cfg.split))
    summary = evaluate_split(predictor, dataset, splits[cfg.split], protocol, out_dir,
                             cfg.save_predictions, cfg.save_probabilities)
    print(format_summary(summary, dataset.class_names, title=f"{dataset.name} {cfg.split} split ({ckpt_path.name})"))
    return summary

"""Evaluate a split with a trained model; ``evaluate(cfg)`` re-evaluates a saved checkpoint."""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from functools import partial
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mcseg.calibration import PosthocConfig, fit_posthoc, load_calibration, scale_logits, scalers_to_apply
from mcseg.config import typed
from mcseg.data.base import SegmentationDataset
from mcseg.data.cases import CaseRef
from mcseg.data.io import write_json
from mcseg.data.validate import validate_cases
from mcseg.errors import ConfigError
from mcseg.engine.checkpoint import load_checkpoint, load_model_weights
from mcseg.engine.evaluator import EvalProtocol, Evaluator
from mcseg.engine.inference import InferenceConfig
from mcseg.engine.predict import SegmentationPredictor, evaluate_cases
from mcseg.rundir import holds_checkpoint_run
from mcseg.runtime import resolve_device
from mcseg.text import plural
from mcseg.sweep import find_run_dirs
from mcseg.targets import instantiate_checked

log = logging.getLogger(__name__)
# Headline values copied from each post-hoc scaler's summary into the main summary's "posthoc"
POSTHOC_KEYS = ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece", "mean_nll",
                "mean_brier")


def evaluate_split(
    predictor: SegmentationPredictor, dataset: SegmentationDataset, refs: list[CaseRef], protocol: EvalProtocol,
    out_dir: Path, save_predictions: bool, save_probabilities: bool, scalers: dict[str, dict] | None = None,
) -> dict:
    """Segment ``refs`` one case at a time and write per_case.csv, summary.json and diagrams to ``out_dir``.

    Each post-hoc scaler in ``scalers`` (name -> fitted parameters) is evaluated in the same
    pass; its files go to ``out_dir/<name>/`` and its headline values to ``summary["posthoc"]``.
    """
    if not refs:
        raise ValueError(f"dataset {dataset.name}: the split to evaluate has no cases")

    def new_evaluator() -> Evaluator:
        return Evaluator(dataset.num_classes, dataset.class_names, protocol, predictor.multilabel)

    evaluator = new_evaluator()
    posthoc = {name: (partial(scale_logits, params=params, channel_dim=0), new_evaluator())
               for name, params in (scalers or {}).items()}
    dataset.prepare(refs)
    cases = (dataset.load(ref) for ref in refs)  # one case in memory at a time
    evaluate_cases(predictor, cases, evaluator, dataset.restore, out_dir, save_predictions, save_probabilities,
                   protocol.save_uncertainty, posthoc=posthoc)
    after = {}
    for name, (_, scaled_evaluator) in posthoc.items():
        scaled = scaled_evaluator.write(out_dir / name, extra={"posthoc": {"scaler": name, "params": scalers[name]}})
        after[name] = {"params": scalers[name], **{k: scaled.get(k) for k in POSTHOC_KEYS},
                       "pooled": {k: scaled["pooled"].get(k) for k in ("ece", "classwise_ece", "nll", "brier")}}
    summary = evaluator.write(out_dir, extra={"posthoc": after} if after else None)
    log.info("evaluation of %s written to %s", plural(len(refs), "case"), out_dir)
    return summary


def _fmt(value, digits: int = 4) -> str:
    return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def format_summary(summary: dict, class_names: list[str], title: str) -> str:
    """A plain-text table of per-class Dice and HD95 plus the case-level calibration means."""
    protocol = summary.get("protocol", {})
    lines = [f"== {title}: {plural(summary.get('n_cases') or 0, 'case')}; ECE region {protocol.get('region')}, "
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
    for name, after in summary.get("posthoc", {}).items():
        shown = f"T={after['params']['temperature']:.3f}" if "temperature" in after["params"] else "per-class w, b"
        lines.append(f"post-hoc {name} ({shown}): Dice {_fmt(after.get('mean_foreground_dice'))}   "
                     f"ECE {_fmt(after.get('mean_ece'))}   classwise ECE {_fmt(after.get('mean_classwise_ece'))}   "
                     f"NLL {_fmt(summary.get('mean_nll'))} -> {_fmt(after.get('mean_nll'))}")
    return "\n".join(lines)


def evaluate(cfg: DictConfig) -> dict:
    """Evaluate ``cfg.ckpt``, or the ``cfg.checkpoint`` of every run under ``cfg.runs`` (a run or sweep directory)."""
    if bool(cfg.get("ckpt")) == bool(cfg.get("runs")):
        raise ConfigError("evaluate: set exactly one of ckpt=<run>/checkpoints/best.pt (one checkpoint) "
                          "or runs=<run or sweep directory> (every run under it)")
    if cfg.get("ckpt"):
        return evaluate_checkpoint(cfg, Path(cfg.ckpt).expanduser().resolve())
    return evaluate_runs(cfg, Path(cfg.runs).expanduser().resolve())


def find_runs(root: Path, checkpoint: str = "best.pt") -> list[Path]:
    """Run directories under ``root`` (itself included) that hold ``checkpoints/<checkpoint>``."""
    return [d for d in find_run_dirs([root]) if (d / "checkpoints" / checkpoint).is_file()]


def evaluate_runs(cfg: DictConfig, root: Path) -> dict:
    """Evaluate every run under ``root``; a run that fails is reported and the others go on."""
    if cfg.get("eval_dir"):
        raise ConfigError("evaluate: eval_dir names one output directory; with runs= each run's results go to "
                          "<run>/eval/<split>")
    runs = find_runs(root, cfg.checkpoint)
    if not runs:
        raise FileNotFoundError(f"runs={root}: no run directory with checkpoints/{cfg.checkpoint} under it")
    results: dict[str, dict] = {}
    for i, run_dir in enumerate(runs, 1):
        log.info("run %d/%d: %s", i, len(runs), run_dir)
        try:
            summary = evaluate_checkpoint(cfg, run_dir / "checkpoints" / cfg.checkpoint)
            results[str(run_dir)] = {"status": "completed", "mean_foreground_dice": summary.get("mean_foreground_dice"),
                                     "mean_ece": summary.get("mean_ece")}
        except Exception as exc:  # one broken run must not hide the others' results
            log.error("run %s failed: %s: %s", run_dir, type(exc).__name__, exc)
            results[str(run_dir)] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    write_json(Path(cfg.paths.output_dir) / "evaluated_runs.json", results)
    failed = [r for r, v in results.items() if v["status"] != "completed"]
    print(f"evaluated {len(runs) - len(failed)} of {len(runs)} runs under {root}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if failed and len(failed) == len(runs):
        raise ValueError(f"evaluate: every run under {root} failed (see {cfg.paths.output_dir}/evaluated_runs.json)")
    return results


def posthoc_scalers(cfg: DictConfig, run_cfg: DictConfig, run_dir: Path, predictor, checkpoint: str) -> dict:
    """The scalers of ``cfg.posthoc.apply`` for this run: from calibration.json, else fitted now on the
    run's own validation split (also when evaluating another dataset) and saved."""
    from mcseg.engine.data import build_dataset, resolve_split

    posthoc = typed(cfg.posthoc, PosthocConfig, "posthoc")
    if not posthoc.apply:
        return {}
    record = None if posthoc.refit else load_calibration(run_dir)
    if record is not None and record.get("checkpoint") != checkpoint:
        record = None  # fitted for another checkpoint of this run
    if record is None or set(posthoc.apply) - set(record.get("scalers", {})):
        own = build_dataset(run_cfg.dataset)
        refs = resolve_split(own, run_cfg.dataset, run_dir)["val"]
        own.prepare(refs)
        fit_cfg = replace(posthoc, fit=sorted(set(posthoc.fit) | set(posthoc.apply)))
        record = fit_posthoc(predictor, (own.load(r) for r in refs), fit_cfg, run_dir, checkpoint)
    return scalers_to_apply(record, posthoc.apply, run_dir)


@holds_checkpoint_run  # never writes into a run another process is training or evaluating
def evaluate_checkpoint(cfg: DictConfig, ckpt_path: Path) -> dict:
    """Re-evaluate ``ckpt_path`` with the run's saved config; ``cfg.dataset`` replaces its dataset if given."""
    from mcseg.engine.data import build_dataset, record_dataset_facts, resolve_split
    from mcseg.train import build_predictor

    state = load_checkpoint(ckpt_path)
    run_cfg = OmegaConf.create(state["config"])
    run_dir = ckpt_path.parent.parent
    other_dataset = cfg.get("dataset") is not None
    eval_cfg = OmegaConf.create(state["config"])  # the run's own config stays intact for calibration
    if other_dataset:
        eval_cfg.dataset = cfg.dataset
    device = resolve_device(cfg.device)
    dataset = build_dataset(eval_cfg.dataset)
    record_dataset_facts(eval_cfg, dataset)
    # Another dataset gets its own split.json in this job's directory; the run's own is reused otherwise.
    splits = resolve_split(dataset, eval_cfg.dataset, Path(cfg.paths.output_dir) if other_dataset else run_dir)
    validate_cases(dataset, splits[cfg.split], "scoring")  # the same header checks as training and mcseg-data check
    model = instantiate_checked(run_cfg.model, "model").to(device)
    load_model_weights(model, state["model"], ckpt_path)
    loss_fn = instantiate_checked(run_cfg.loss, "loss").to(device)
    loss_fn.load_state_dict(state.get("loss", {}))
    inference = typed(run_cfg.inference, InferenceConfig, "inference")
    protocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    predictor = build_predictor(eval_cfg, model, loss_fn, device, inference, run_cfg.trainer.precision)
    scalers = posthoc_scalers(cfg, run_cfg, run_dir, predictor, ckpt_path.name)
    if cfg.eval_dir:
        out_dir = Path(cfg.eval_dir)
    else:
        out_dir = run_dir / "eval" / (f"{dataset.name}-{cfg.split}" if other_dataset else str(cfg.split))
    summary = evaluate_split(predictor, dataset, splits[cfg.split], protocol, out_dir,
                             cfg.save_predictions, cfg.save_probabilities, scalers)
    print(format_summary(summary, dataset.class_names, title=f"{dataset.name} {cfg.split} split ({ckpt_path.name})"))
    return summary

"""``train(cfg) -> dict``: build everything from the config (:func:`mcseg.training.build.build_run`), train,
evaluate the test split.

The CLI (``train.py``), tests and sweeps (an Optuna sweeper optimises the return value)
all call this one function.
"""
from __future__ import annotations

import logging
import math

from omegaconf import DictConfig

from mcseg.environment import environment_record
from mcseg.errors import TrainingInterrupted
from mcseg.evaluation.conformal import check_conformal, conformal_config
from mcseg.evaluation.figure_table import summary_keys
from mcseg.evaluation.predictor import Evaluation, Member, Outputs, PosthocPlan, evaluate_predictor
from mcseg.evaluation.provenance import checkpoint_identity, hydra_overrides
from mcseg.files import write_json
from mcseg.identity import run_identity
from mcseg.slots import slot_record
from mcseg.training.build import Run, build_run
from mcseg.training.distributed import shutdown
from mcseg.trials import TrialPruned, trial_reporter

log = logging.getLogger("mcseg.train")


def train(cfg: DictConfig) -> dict:
    """Train and evaluate as configured; return validation and test metrics."""
    conformal_config(cfg)  # a bad conformal node refused before the training, not after it
    run = build_run(cfg)
    trainer, trackers = run.trainer, run.trackers
    tcfg, run_dir, device = trainer.cfg, trainer.run_dir, trainer.device
    try:
        # inside an Optuna sweep: each validation is reported to the job's trial, whose pruner may stop the run
        trainer.trial = trial_reporter(lambda metrics: optimized_value(metrics, cfg), optimized_metric(cfg))
        trainer.fit()
        if not run.dist.is_main:  # torchrun: the test evaluation and the result files are rank 0's
            return {}
        summary = evaluate_test(run, cfg)
    except BaseException as exc:
        run.dist.report_failure(exc)  # torchrun/submitit: the ranks waiting at a barrier stop now
        stopped = (KeyboardInterrupt, TrainingInterrupted, TrialPruned)  # on purpose, not by an error
        trackers.close("KILLED" if isinstance(exc, stopped) else "FAILED")
        raise
    else:
        trackers.close()
    finally:
        shutdown(run.dist)
    headline = summary_keys("headline")
    result = {f"test/{k}": summary.get(k) for k in headline}
    result.update({k: v for k, v in trainer.history[-1].items() if k.startswith(("val/", "val_full/"))} if trainer.history else {})
    for name, after in summary.get("posthoc", {}).items():
        result.update({f"test_{name}/{k}": after.get(k) for k in headline})
    result["best_epoch"] = trainer.best_epoch
    result[f"best/{tcfg.monitor}"] = trainer.best_value
    best = next((h for h in trainer.history if h["epoch"] == trainer.best_epoch), {})
    result.update({f"best_{k}": v for k, v in best.items() if k.startswith(("val/", "val_full/"))})
    result["score"] = validation_score(best, cfg.get("score"))
    result["device"] = run.device_info
    result["environment"] = environment_record(device, tcfg.deterministic, run.reductions_before)
    if slot_record():  # hydra/launcher=slots
        result["slot"] = slot_record()
    # what mcseg-report reads: the configuration of this run and its validation (selection) metrics
    write_json(run_dir / "result.json", {**result, "run": run.identity})
    return result


def evaluate_test(run: Run, cfg: DictConfig) -> dict:
    """After fitting: the test split of best.pt evaluated into ``<run>/eval/test`` through the one evaluation of a
    predictor (:func:`mcseg.evaluation.predictor.evaluate_predictor`), with its post-hoc fit (``posthoc.fit``) on
    the validation cases the trainer loaded, its conformal pass (``conformal.enabled``) and DICOM export
    (``inference.save_dicom``), then sent to the trackers; returns its summary."""
    trainer, posthoc, inference = run.trainer, run.posthoc, run.inference
    run_dir, predictor, out = trainer.run_dir, trainer.predictor, trainer.run_dir / "eval" / "test"
    trained_on, unseen = trainer.provenance["dataset"], trainer.provenance["classes_unseen_in_training"]
    path = run_dir / "checkpoints" / "best.pt"
    state = trainer.load_best()
    best = checkpoint_identity(path, state)
    member = Member(predictor, best, run_dir)
    evaluation = Evaluation(
        predictor, [member], member, run.dataset, run.splits["test"], "test", "training",
        trainer.provenance["split"]["test"], out, {"checkpoint": {**best, "selected": True}, "run_dir": str(run_dir)},
        state, cfg, path, trainer.provenance["split"], run.dataset, "test", hydra_overrides(),
        environment_record(trainer.device, trainer.cfg.deterministic, run.reductions_before), best["sha256"],
        f"{path.name}, sha256 {best['sha256'][:8]}", log_figure=lambda tag, figure: run.trackers.figure(
            tag, figure, trainer.global_step),
        # what the run recorded of its data: the dataset it trained on and the test cases it shares with training
        dataset_record=trained_on,
        content={"seen_in_training": {"train": run.shared["test"]} if "test" in run.shared else {},
                 "classes_unseen_in_training": unseen})
    plan = PosthocPlan({}, posthoc, run_dir, trainer.val_cases) if posthoc.fit else PosthocPlan({})
    outputs = Outputs(inference.save_predictions, inference.save_probabilities, conformal_config(cfg),
                      inference.save_dicom, dicom_stops=False)
    check_conformal(outputs.conformal, "test", trainer.provenance["split"])
    summary = evaluate_predictor(evaluation, [plan], trainer.protocol, outputs)
    best_val = validation_score(next((h for h in trainer.history if h["epoch"] == trainer.best_epoch), {}),
                                cfg.get("score"))
    run.trackers.evaluation("test", summary, out, trainer.global_step,
                            hparams={"params": hparams_of(cfg), "metrics": {"final/best_val_score": best_val}})
    run.trackers.save_record(trainer.global_step)
    return summary


def hparams_of(cfg: DictConfig) -> dict:
    """What TensorBoard's HParams view lists of a run: its loss, dataset and seed, and every override
    (numbers as numbers, lists as text)."""
    identity = run_identity(cfg)
    values = {"loss": identity["loss_name"], "dataset": identity["dataset"], "seed": identity["seed"]}
    for override in identity["overrides"]:
        key, _, text = override.lstrip("+~").partition("=")
        try:
            value = float(text) if any(c in text for c in ".e") else int(text)
        except ValueError:
            value = text
        values.setdefault(key, value)
    return values


def optimized_metric(cfg: DictConfig) -> str:
    """The name of what sweeps optimise (``optimized_metric`` of the hparams_search presets; ``score`` without)."""
    return cfg.get("optimized_metric") or "score"


def optimized_value(metrics: dict, cfg: DictConfig) -> float | None:
    """What a sweep optimises, from one validation's ``metrics``: the weighted :func:`validation_score` for
    ``score``, else that metric as the trainer records it (e.g. ``val/mean_foreground_dice``); None if unmeasured."""
    metric = optimized_metric(cfg)
    return validation_score(metrics, cfg.get("score")) if metric == "score" else metrics.get(metric)


def validation_score(metrics: dict, weights) -> float | None:
    """``sum_k w_k * metrics["val/" + k]`` over the ``score`` weights (validation metrics of the best epoch).

    The one number sweepers optimise and reports select by (``optimized_metric: score``);
    None when a weighted metric was not measured (e.g. ECE undefined on empty validation cases).
    """
    if not weights:
        return None
    total = 0.0
    for key, weight in weights.items():
        value = metrics.get(f"val/{key}")
        if value is None or not math.isfinite(value):
            return None
        total += float(weight) * float(value)
    return total

"""``train(cfg) -> dict``: build everything from the config (:func:`mcseg.training.build.build_run`), train,
evaluate the test split.

The CLI (``train.py``), tests and sweeps (an Optuna sweeper optimises the return value)
all call this one function.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

from omegaconf import DictConfig

from mcseg.calibration import fit_posthoc, scalers_to_apply
from mcseg.environment import environment_record
from mcseg.errors import TrainingInterrupted
from mcseg.evaluation.conformal import check_conformal, conformal_config, conformal_pass
from mcseg.evaluation.figure_table import summary_keys
from mcseg.evaluation.provenance import checkpoint_identity, evaluation_provenance, hydra_overrides
from mcseg.evaluation.split import evaluate_split, format_summary
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
    trainer, dataset, trackers = run.trainer, run.dataset, run.trackers
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
    print(format_summary(summary, dataset.class_names, title=f"{dataset.name} test split"))
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
    """After fitting: post-hoc calibration of best.pt on the validation cases (``posthoc.fit``), then the test
    split evaluated into ``<run>/eval/test`` and sent to the trackers; returns its summary."""
    trainer, posthoc, inference = run.trainer, run.posthoc, run.inference
    run_dir, predictor, protocol = trainer.run_dir, trainer.predictor, trainer.protocol
    trained_on, unseen = trainer.provenance["dataset"], trainer.provenance["classes_unseen_in_training"]
    best = checkpoint_identity(run_dir / "checkpoints" / "best.pt", trainer.load_best())
    overrides = hydra_overrides()
    scalers = {}
    if posthoc.fit:
        record = fit_posthoc(predictor, trainer.val_cases, posthoc, run_dir, best,
                             {"dataset": trained_on, "overrides": overrides}, protocol)
        scalers = scalers_to_apply(record, posthoc.apply, run_dir)
    provenance = evaluation_provenance(
        {"checkpoint": {**best, "selected": True}, "run_dir": str(run_dir)},
        {"name": "test", "source": "training", "cases": trainer.provenance["split"]["test"]}, trained_on, trained_on,
        predictor, overrides, run_dir / "eval" / "test",
        environment_record(trainer.device, trainer.cfg.deterministic, run.reductions_before),
        {"seen_in_training": {"train": run.shared["test"]} if "test" in run.shared else {},
         "classes_unseen_in_training": unseen})
    summary = evaluate_split(
        predictor, run.dataset, run.splits["test"], protocol, run_dir / "eval" / "test",
        inference.save_predictions, inference.save_probabilities, scalers, provenance,
    )
    summary = conformal_of_run(run, cfg, scalers, provenance, summary)
    if inference.save_dicom:  # after the conformal pass: its masks are exported too (docs/report_html.md)
        dicom_of_run(run_dir / "eval" / "test", summary, run.splits["test"])
    best_val = validation_score(next((h for h in trainer.history if h["epoch"] == trainer.best_epoch), {}),
                                cfg.get("score"))
    run.trackers.evaluation("test", summary, run_dir / "eval" / "test", trainer.global_step,
                            hparams={"params": hparams_of(cfg), "metrics": {"final/best_val_score": best_val}})
    run.trackers.save_record(trainer.global_step)
    return summary


def dicom_of_run(folder: Path, summary: dict, refs: list) -> None:
    """``inference.save_dicom=true``: the test cases as DICOM into ``folder/dicom``, each over its own image file
    (:mod:`mcseg.evaluation.dicom_cases`). A case that cannot be written (no image file, another grid) is logged
    with the reason and left out: the run and its evaluation stand."""
    from mcseg.evaluation.dicom import DicomError
    from mcseg.evaluation.dicom_cases import export_evaluation

    images = {r.case_id: Path(r.image_paths[0]) for r in refs if r.image_paths}
    try:
        log.info("DICOM: %d objects in %s", len(export_evaluation(folder, summary, images)), folder / "dicom")
    except (DicomError, OSError) as exc:
        log.error("inference.save_dicom: %s", exc)


def conformal_of_run(run: Run, cfg: DictConfig, scalers: dict, provenance: dict, summary: dict) -> dict:
    """``conformal.enabled=true``: evaluate.py's conformal pass (:mod:`mcseg.evaluation.conformal`), fitted on
    every validation case of the run and applied to its test split, into ``<run>/eval/test/conformal``; the
    overlay figures (``conformal.figures``) also go to the trackers (TensorBoard images ``conformal/<source>/<case>``)."""
    config = conformal_config(cfg)
    check_conformal(config, "test", run.trainer.provenance["split"])
    if not config.enabled:
        return summary
    step = run.trainer.global_step
    return conformal_pass(config, run.trainer.predictor, run.dataset, run.splits["val"], run.dataset,
                          run.splits["test"], scalers, run.trainer.run_dir / "eval" / "test", provenance, summary,
                          log_figure=lambda tag, figure: run.trackers.figure(tag, figure, step))


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

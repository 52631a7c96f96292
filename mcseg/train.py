"""``train(cfg) -> dict``: build everything from the config, train, evaluate the test split.

The CLI (``train.py``), tests and sweeps (an Optuna sweeper optimises the return value)
all call this one function.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from mcseg.calibration import PosthocConfig, fit_posthoc, scalers_to_apply
from mcseg.config import LoggerConfig, TrainerConfig, typed, validate_train_config
from mcseg.data.io import write_json
from mcseg.errors import ConfigError, TrainingInterrupted
from mcseg.data.build import check_run_inputs
from mcseg.inference.build import build_predictor
from mcseg.training.loader import build_dataset, build_train_loader, load_cases, record_dataset_facts, resolve_split
from mcseg.training.distributed import init_distributed, shutdown
from mcseg.evaluation.evaluator import EvalProtocol
from mcseg.evaluation.figures import summary_keys
from mcseg.inference.volume import InferenceConfig
from mcseg.training.loggers import Trackers, build_trackers, check_libraries, config_params, flatten, logger_settings
from mcseg.training.trainer import Trainer
from mcseg.evaluation.split import evaluate_split, format_summary
from mcseg.data.fingerprint import split_fingerprints
from mcseg.data.split import SPLITS
from mcseg.evaluation.provenance import (checkpoint_identity, classes_unseen_in_training, configuration_sha256,
                                    content_lookup, dataset_identity, evaluation_provenance,
                                    hydra_overrides, split_case_ids, warn_shared_content)
from mcseg.training.relaunch import check_launch
from mcseg.sweep import run_identity, sweep_dir_of_job
from mcseg.rundir import begin as begin_run
from mcseg.environment import environment_record
from mcseg.runtime import describe_device, keep_freed_memory, seed_everything, thread_reductions
from mcseg.targets import instantiate_checked

log = logging.getLogger(__name__)


def check_soft_targets(loss_node: DictConfig) -> None:
    """``dataset.raters.target=mean`` trains on soft targets: the configured loss must be defined for them
    (built here once to ask, before anything is loaded or written)."""
    from mcseg.losses.base import hard_label_only

    loss = instantiate_checked(loss_node, "loss")
    if not getattr(loss, "soft_targets", False):
        raise ConfigError(hard_label_only(loss))


def train(cfg: DictConfig) -> dict:
    """Train and evaluate as configured; return validation and test metrics."""
    validate_train_config(cfg)
    run_dir = Path(cfg.paths.output_dir)
    tcfg: TrainerConfig = typed(cfg.trainer, TrainerConfig, "trainer")
    lcfg: LoggerConfig = typed(cfg.logger, LoggerConfig, "logger")
    check_libraries(cfg.logger)  # logger=mlflow without the extra: refused before anything is written
    inference: InferenceConfig = typed(cfg.inference, InferenceConfig, "inference")
    protocol: EvalProtocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    posthoc: PosthocConfig = typed(cfg.posthoc, PosthocConfig, "posthoc")
    if set(posthoc.apply) - set(posthoc.fit):
        raise ConfigError(f"config key 'posthoc.apply'={posthoc.apply}: each applied scaler must also be in "
                          f"posthoc.fit={posthoc.fit} (training fits them on the validation split)")
    if "lts" in posthoc.fit:  # its settings in the model's geometry: refused now, not after training
        sampling = cfg.dataset.sampling
        posthoc.lts_config(sampling.dims, sampling.patch_size, sampling.get("slice_axis", -1))
    headline = summary_keys("headline")
    unknown = sorted(set(cfg.get("score") or {}) - set(headline))
    if unknown:
        raise ConfigError(f"config key 'score.{unknown[0]}': not a validation metric (expected {', '.join(headline)})")
    keep_freed_memory()  # before the first large tensor (mcseg.runtime)
    seed_everything(int(cfg.seed), tcfg.deterministic)
    reductions_before = thread_reductions()
    dist, device = init_distributed(tcfg.device)  # torchrun: this rank's process group and device
    run_dir = Path(dist.broadcast_object(str(run_dir)))  # rank 0's run directory on every rank

    dataset = build_dataset(cfg.dataset)
    record_dataset_facts(cfg, dataset)
    if dataset.raters["target"] == "mean":  # soft targets: refused now by a loss that needs hard labels
        check_soft_targets(cfg.loss)
    container = OmegaConf.to_container(cfg, resolve=True)
    # refused launches (last.pt without resume, a changed config, a finished run) end here, nothing written
    resume_from = check_launch(run_dir, tcfg.resume, tcfg.auto_resume, container, content_lookup(dataset))
    begin_run(resumed=resume_from is not None)
    with dist.main_first():  # torchrun: rank 0 writes split.json and the cache, the others then read them
        splits = resolve_split(dataset, cfg.dataset, run_dir)
        check_run_inputs(cfg, dataset, splits)  # every case's headers, posthoc vs. the split: before any work
        dataset.prepare(splits["all"])  # preprocess and cache once (no-op when preprocessing is off)
    log.info("dataset %s: %s", dataset.name, {k: len(v) for k, v in splits.refs.items()})
    content = split_fingerprints(dataset, {name: splits[name] for name in SPLITS})  # cached: a stat per file
    shared = warn_shared_content(content, f"dataset {dataset.name}")
    train_cases = load_cases(dataset, splits["train"])
    capped = tcfg.val_max_cases and not tcfg.full_val_every  # then the other validation cases are never used
    val_cases = load_cases(dataset, splits["val"][: tcfg.val_max_cases] if capped else splits["val"])

    model = instantiate_checked(cfg.model, "model").to(device)
    loss_fn = instantiate_checked(cfg.loss, "loss").to(device)
    if getattr(loss_fn, "multilabel", False) != dataset.multilabel:
        raise ValueError(f"loss {cfg.loss._target_} and dataset {dataset.name} disagree on multi-label outputs")
    optimizer = instantiate_checked(cfg.optim, "optim")(params=model.parameters())
    scheduler = instantiate_checked(cfg.scheduler, "scheduler")(optimizer=optimizer)
    predictor = build_predictor(cfg, model, loss_fn, device, inference, tcfg.precision)
    loader, sampler = build_train_loader(train_cases, cfg.dataset, int(cfg.seed), device, dist)

    # what every checkpoint records of its data: the split's case ids, their content and the dataset's identity
    split_ids = split_case_ids(splits.refs)
    trained_on = dataset_identity(dataset, [c for ids in split_ids.values() for c in ids], content)
    # the run's identity: its overrides (labels), what it ran (the resolved config) and the content of its data
    identity = {**run_identity(cfg), "configuration_sha256": configuration_sha256(container),
                "dataset_content": trained_on.get("content_sha256")}
    trackers = open_trackers(container, run_dir, dataset.name, resume_from is not None, identity,
                             environment_record(device, tcfg.deterministic)) if dist.is_main else Trackers([])
    trainer = Trainer(
        tcfg, run_dir, model, loss_fn, optimizer, scheduler, loader, sampler, predictor, val_cases, dataset.restore,
        dataset.num_classes, dataset.class_names, protocol, trackers, container, lcfg.images, dist,
    )
    unseen = classes_unseen_in_training(loader.dataset.fg_points, dataset.class_names, dataset.multilabel)
    inputs = split_fingerprints(dataset, {name: splits[name] for name in SPLITS}, inputs=True)  # images alone
    trainer.provenance = {"split": split_ids, "dataset": trained_on, "content": content, "inputs": inputs,
                          "classes_unseen_in_training": unseen}
    device_info = describe_device(device, tcfg.precision, trainer.channels_last, tcfg.compile)
    log.info("device: %s", ", ".join(f"{k} {v}" for k, v in device_info.items()))
    if resume_from is not None:
        trainer.resume(resume_from)  # a deterministic run takes its recorded thread count back
    trainer.provenance["environment"] = environment_record(device, tcfg.deterministic)  # in every checkpoint
    try:
        trainer.fit()
        if not dist.is_main:  # torchrun: the test evaluation and the result files are rank 0's
            return {}
        best_state = trainer.load_best()
        del train_cases
        scalers = {}
        best_path = run_dir / "checkpoints" / "best.pt"
        best = checkpoint_identity(best_path, best_state)
        overrides = hydra_overrides()
        if posthoc.fit:  # post-hoc calibration of best.pt on the validation cases
            record = fit_posthoc(predictor, val_cases, posthoc, run_dir, best,
                                 {"dataset": trained_on, "overrides": overrides}, protocol)
            scalers = scalers_to_apply(record, posthoc.apply, run_dir)
        provenance = evaluation_provenance(
            {"checkpoint": {**best, "selected": True}, "run_dir": str(run_dir)},
            {"name": "test", "source": "training", "cases": split_ids["test"]}, trained_on, trained_on, predictor,
            overrides, run_dir / "eval" / "test", environment_record(device, tcfg.deterministic, reductions_before),
            {"seen_in_training": {"train": shared["test"]} if "test" in shared else {},
             "classes_unseen_in_training": unseen})
        summary = evaluate_split(
            predictor, dataset, splits["test"], protocol, run_dir / "eval" / "test",
            inference.save_predictions, inference.save_probabilities, scalers, provenance,
        )
        best_val = validation_score(next((h for h in trainer.history if h["epoch"] == trainer.best_epoch), {}),
                                    cfg.get("score"))
        trackers.evaluation("test", summary, run_dir / "eval" / "test", trainer.global_step,
                            hparams={"params": hparams_of(cfg), "metrics": {"final/best_val_score": best_val}})
        trackers.save_record(trainer.global_step)
    except BaseException as exc:
        dist.report_failure(exc)  # torchrun/submitit: the ranks waiting at a barrier stop now
        trackers.close("KILLED" if isinstance(exc, (KeyboardInterrupt, TrainingInterrupted)) else "FAILED")
        raise
    else:
        trackers.close()
    finally:
        shutdown(dist)
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
    result["device"] = device_info
    result["environment"] = environment_record(device, tcfg.deterministic, reductions_before)
    # what mcseg-report reads: the configuration of this run and its validation (selection) metrics
    write_json(run_dir / "result.json", {**result, "run": identity})
    return result


def open_trackers(container: dict, run_dir: Path, dataset_name: str, resumed: bool, identity: dict,
                  environment: dict) -> Trackers:
    """The trackers of ``logger`` (mcseg.training.loggers) for this run: a fresh run sends its flat configuration
    and its identity and provenance (code, libraries, data fingerprint); a resumed one reopens its run."""
    logger = logger_settings(container.get("logger"), dataset_name)
    trackers = build_trackers(logger, run_dir, resumed=resumed, sweep_dir=sweep_dir_of_job(), run_name=run_dir.name)
    if not resumed:
        tags = {"configuration": identity["configuration"], "configuration_sha256": identity["configuration_sha256"],
                "loss": identity["loss_name"], "dataset": identity["dataset"], "seed": identity["seed"],
                "dataset_content_sha256": identity.get("dataset_content"),
                **flatten({"code": environment["code"], "libraries": environment["libraries"]})}
        trackers.start(config_params(container), {k: v for k, v in tags.items() if v is not None})
    trackers.save_record()  # before the first value: a resume or re-evaluation finds the run
    return trackers


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

"""``build_run(cfg) -> Run``: the construction half of :func:`mcseg.train.train`, up to the trainer's ``fit``.

From the config it makes the pre-flight checks (refused launches write nothing), begins the run directory, builds
the dataset and its split, the loaders, model, loss, optimiser, scheduler, predictor and trackers, and the
:class:`~mcseg.training.trainer.Trainer` holding them (resumed from ``last.pt`` when asked). ``train()`` then fits
and evaluates; ``scripts/benchmark.py`` times the trainer's epochs on the same construction.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mcseg.calibration import PosthocConfig
from mcseg.config import EvalProtocol, InferenceConfig, LoggerConfig, TrainerConfig, check_logger, typed, validate_train_config
from mcseg.data.base import SegmentationDataset
from mcseg.data.build import (Splits, build_dataset, check_run_inputs, choose_split, record_dataset_facts,
                              save_splits)
from mcseg.data.fingerprint import split_fingerprints
from mcseg.data.split import SPLITS
from mcseg.environment import environment_record
from mcseg.errors import ConfigError
from mcseg.evaluation.provenance import (classes_unseen_in_training, configuration_sha256, content_lookup,
                                         dataset_identity, split_case_ids, warn_shared_content)
from mcseg.identity import run_identity, sweep_dir_of_job
from mcseg.inference.build import build_predictor
from mcseg.rundir import begin as begin_run
from mcseg.runtime import describe_device, keep_freed_memory, seed_everything, thread_reductions
from mcseg.targets import instantiate_checked
from mcseg.training.config_checks import check_training_config
from mcseg.training.distributed import DistContext, init_distributed
from mcseg.training.loader import build_train_loader, load_cases
from mcseg.trackers import Trackers, build_trackers, check_libraries, config_params, flatten, logger_settings
from mcseg.training.relaunch import check_launch
from mcseg.training.settings import TrainerSettings, TrainingParts
from mcseg.training.trainer import Trainer

log = logging.getLogger("mcseg.train")


@dataclass
class Run:
    """A run built and ready to fit (:func:`build_run`), with what ``train()`` needs after fitting."""

    trainer: Trainer
    dataset: SegmentationDataset
    splits: Splits
    inference: InferenceConfig
    posthoc: PosthocConfig
    identity: dict  # result.json's "run": overrides, loss, dataset, seed, configuration sha256, data content
    shared: dict  # per split, its cases whose content is also in another split (warn_shared_content)
    reductions_before: dict  # thread reductions before the run (the test evaluation's environment record)
    device_info: dict  # describe_device: what the run computes on

    @property
    def dist(self) -> DistContext:
        return self.trainer.dist

    @property
    def trackers(self) -> Trackers:
        return self.trainer.trackers


def check_soft_targets(loss_node: DictConfig) -> None:
    """``dataset.raters.target=mean`` trains on soft targets: the configured loss must be defined for them
    (built here once to ask, before anything is loaded or written)."""
    from mcseg.losses.base import hard_label_only

    loss = instantiate_checked(loss_node, "loss")
    if not getattr(loss, "soft_targets", False):
        raise ConfigError(hard_label_only(loss))


def trainer_settings(tcfg: TrainerConfig, run_dir: Path, dataset: SegmentationDataset, protocol: EvalProtocol,
                     container: dict, images: int) -> TrainerSettings:
    """The trainer's settings from the typed config nodes (``trainer``, ``evaluation``, ``logger.images``), the
    run directory, the dataset's classes and the resolved configuration ``container``."""
    return TrainerSettings(trainer=tcfg, run_dir=run_dir, num_classes=dataset.num_classes,
                           class_names=tuple(dataset.class_names), protocol=protocol, config_container=container,
                           images=images)


def build_run(cfg: DictConfig) -> Run:
    """Check the launch, begin the run directory and build everything :meth:`Trainer.fit` needs."""
    validate_train_config(cfg)
    run_dir = Path(cfg.paths.output_dir)
    tcfg: TrainerConfig = typed(cfg.trainer, TrainerConfig, "trainer")
    lcfg: LoggerConfig = check_logger(cfg.logger)
    check_libraries(cfg.logger)  # logger=mlflow without the extra: refused before anything is written
    inference: InferenceConfig = typed(cfg.inference, InferenceConfig, "inference")
    protocol: EvalProtocol = typed(cfg.evaluation, EvalProtocol, "evaluation")
    posthoc: PosthocConfig = check_training_config(cfg)
    keep_freed_memory()  # before the first large tensor (mcseg.runtime)
    seed_everything(int(cfg.seed), tcfg.deterministic)
    reductions_before = thread_reductions()
    dist, device = init_distributed(tcfg.device)  # torchrun: this rank's process group and device
    run_dir = Path(dist.broadcast_object(str(run_dir)))  # rank 0's run directory on every rank

    dataset = build_dataset(cfg.dataset)
    posthoc.check_outputs(dataset.multilabel)
    record_dataset_facts(cfg, dataset)
    if dataset.raters["target"] == "mean":  # soft targets: refused now by a loss that needs hard labels
        check_soft_targets(cfg.loss)
    container = OmegaConf.to_container(cfg, resolve=True)
    # refused launches (last.pt without resume, a changed config, a finished run) end here, nothing written
    resume_from = check_launch(run_dir, tcfg.resume, tcfg.auto_resume, container, content_lookup(dataset))
    splits = choose_split(dataset, cfg.dataset, run_dir)  # the same on every rank (read, or made by seed)
    check_run_inputs(cfg, dataset, splits)  # every case's headers, posthoc vs. the split: refused, nothing written
    begin_run(resumed=resume_from is not None)
    with dist.main_first():  # torchrun: rank 0 writes split.json and the cache, the others then read them
        if dist.is_main:
            save_splits(splits, run_dir)
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
    settings = trainer_settings(tcfg, run_dir, dataset, protocol, container, lcfg.images)
    trainer = Trainer(settings, TrainingParts(
        model=model, loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler, loader=loader, sampler=sampler,
        predictor=predictor, val_cases=val_cases, restore=dataset.restore, trackers=trackers, dist=dist))
    unseen = classes_unseen_in_training(loader.dataset.fg_points, dataset.class_names, dataset.multilabel)
    inputs = split_fingerprints(dataset, {name: splits[name] for name in SPLITS}, inputs=True)  # images alone
    trainer.provenance = {"split": split_ids, "dataset": trained_on, "content": content, "inputs": inputs,
                          "classes_unseen_in_training": unseen}
    device_info = describe_device(device, tcfg.precision, trainer.channels_last, tcfg.compile)
    device_info["training_batches"] = loader.data_path  # device-resident, workers or in process, and why
    log.info("device: %s", ", ".join(f"{k} {v}" for k, v in device_info.items()))
    if resume_from is not None:
        trainer.resume(resume_from)  # a deterministic run takes its recorded thread count back
    trainer.provenance["environment"] = environment_record(device, tcfg.deterministic)  # in every checkpoint
    return Run(trainer=trainer, dataset=dataset, splits=splits, inference=inference, posthoc=posthoc,
               identity=identity, shared=shared, reductions_before=reductions_before, device_info=device_info)


def open_trackers(container: dict, run_dir: Path, dataset_name: str, resumed: bool, identity: dict,
                  environment: dict) -> Trackers:
    """The trackers of ``logger`` (mcseg.trackers) for this run: a fresh run sends its flat configuration
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

"""Typed schemas for the config nodes, and checks that run before anything is built.

Hydra already refuses command-line overrides of keys that do not exist. These checks
cover the rest: a misspelt key or a wrong type inside a YAML file (an experiment preset,
a user's dataset file) fails at start with the full key named, not an hour into a run.
Nodes with a fixed shape are checked against dataclasses; ``_target_`` nodes are checked
against the signature of the class or function they name: each key a parameter of it, each value of the
parameter's annotated type (``optim.lr=abc``, ``model.channels=16`` are named at start, not by a torch or
MONAI traceback). :func:`resume_mismatch` says where two
resolved configs differ in what decides a checkpoint's model.
"""
from __future__ import annotations

import enum
import importlib
import inspect
import types
import typing
from collections import abc
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mcseg.errors import ConfigError
from mcseg.signatures import static_parameters

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")  # the Hydra configs every entry point composes


@dataclass
class SplitConfig:
    seed: int = 0
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    file: str | None = None


@dataclass
class SamplingConfig:
    dims: int = 2
    patch_size: list[int] = field(default_factory=lambda: [96, 96])
    batch_size: int = 16
    samples_per_epoch: int = 512
    foreground_ratio: float = 0.33
    flip_axes: list[int] = field(default_factory=list)
    intensity: float = 0.0
    slice_axis: int = -1
    num_workers: int | None = None  # loader workers; None: the cores the training step leaves free, at most 8
    # auto | true | false: training cases held on the training device, patches cut there, no worker
    # (mcseg.training.device_cache; auto: on CUDA when they take under a quarter of its free memory)
    device_cache: Any = "auto"


@dataclass
class TrainerConfig:
    max_epochs: int = 20
    device: str = "auto"
    precision: str = "bf16"  # bf16 | 32: bf16 autocast on CUDA (float32 elsewhere); 32 everywhere
    grad_clip: float | None = 12.0
    deterministic: bool = False
    val_every: int = 1
    val_max_cases: int | None = None
    full_val_every: int | None = None  # with val_max_cases: also validate on every case every N epochs (val_full/*)
    monitor: str = "val/mean_foreground_dice"
    monitor_mode: str = "max"
    resume: bool = False
    auto_resume: bool = False  # resume without asking when the run directory holds last.pt
    checkpoint_every_n_steps: int | None = None  # also checkpoint mid-epoch (long epochs, pre-emption)
    nonfinite: str = "stop"  # stop | skip: what a NaN/inf loss or gradient does
    max_nonfinite_skips: int = 5
    log_every_n_steps: int = 20
    progress_bar: bool = True
    compile: bool = False  # torch.compile the training module
    channels_last: str = "auto"  # auto | true | false: channels-last memory layout (auto: CUDA 2D only)

    def __post_init__(self) -> None:
        if self.precision not in ("bf16", "32"):  # fp16 would need a gradient scaler, which is not implemented
            raise ConfigError(f"config key 'trainer.precision': expected bf16 or 32, got {self.precision!r}")
        if str(self.channels_last).lower() not in ("auto", "true", "false"):
            raise ConfigError(f"config key 'trainer.channels_last': expected auto, true or false, "
                              f"got {self.channels_last!r}")
        if self.full_val_every is not None and (self.full_val_every < 1 or not self.val_max_cases):
            raise ConfigError(f"config key 'trainer.full_val_every'={self.full_val_every}: expected an integer >= 1, "
                              "used with trainer.val_max_cases (without a cap every validation is already full)")
        if self.monitor.startswith("val_full/") and not self.full_val_every:
            raise ConfigError(f"config key 'trainer.monitor'={self.monitor}: val_full/* metrics need "
                              "trainer.full_val_every")


REGIONS = ("label_foreground", "union_foreground", "all", "boundary")  # where calibration is measured
HD_DEFINITIONS = ("max_directed", "pooled")
FAILURE_RISKS = ("macro", "micro")  # a case's risk for failure detection (mcseg.metrics.failure.RISKS)  # how the percentile Hausdorff distance pools two directions


@dataclass
class EvalProtocol:
    """Mirrors the Hydra config node ``evaluation`` (configs/evaluation/default.yaml)."""

    region: str = "union_foreground"  # label_foreground | union_foreground | all | boundary
    n_bins: int = 15
    boundary_width_mm: float = 2.0
    hd_percentile: float = 95.0
    hd_definition: str = "max_directed"  # or "pooled"
    bootstrap_samples: int = 1000
    save_uncertainty: bool = False
    # AUROC, UEO, AURC/E-AURC/AUGRC of the uncertainty maps (mcseg.metrics.failure) in every summary
    failure_detection: bool = True
    # its voxel region (voxel AUROC, UEO): null = `region`; `all` = the whole image, as Jungo & Reyes
    failure_region: str | None = None
    failure_risk: str = "macro"  # a case's risk: 1 - macro (mean over classes) | micro (over voxels, ValUES) Dice
    # reliability.png and reliability_histogram.png (their CSVs are written either way); about 1.4 s an
    # evaluation on 2 cores, so debug=fast, which the tests use, turns them off
    figures: bool = True
    seed: int = 0
    # datasets with several raters (docs/protocol.md, "Several raters"): QUBIQ's thresholds (a preset, qubiq
    # or curvas2025, or a list), the volume CRPS (normal | curvas_code) and the voxels of the CURVAS figures
    # (per-rater ECE, volume CRPS): all | curvas2024 | curvas2025
    rater_thresholds: Any = "qubiq"
    rater_volume_crps: str = "normal"
    rater_crop: str = "all"

    def __post_init__(self) -> None:
        checks = {
            "region": (self.region in REGIONS, f"one of {', '.join(REGIONS)}"),
            "n_bins": (self.n_bins >= 1, "an integer >= 1"),
            "boundary_width_mm": (self.boundary_width_mm >= 0, "a width in mm >= 0"),
            "hd_percentile": (0 <= self.hd_percentile <= 100, "a percentile in [0, 100]"),
            "hd_definition": (self.hd_definition in HD_DEFINITIONS, f"one of {', '.join(HD_DEFINITIONS)}"),
            "bootstrap_samples": (self.bootstrap_samples >= 0, "an integer >= 0"),
            "failure_region": (self.failure_region is None or self.failure_region in REGIONS,
                               f"null (the calibration region) or one of {', '.join(REGIONS)}"),
            "failure_risk": (self.failure_risk in FAILURE_RISKS, f"one of {', '.join(FAILURE_RISKS)}"),
            "rater_volume_crps": (self.rater_volume_crps in ("normal", "curvas_code"), "normal or curvas_code"),
            "rater_crop": (self.rater_crop in ("all", "curvas2024", "curvas2025"), "all, curvas2024 or curvas2025"),
        }
        for key, (ok, expected) in checks.items():
            if not ok:
                raise ConfigError(f"config key 'evaluation.{key}': expected {expected}, got {getattr(self, key)!r}")


@dataclass
class InferenceConfig:
    """Mirrors the ``inference`` config node."""

    sw_batch_size: int = 16
    overlap: float = 0.5
    blend_mode: str = "gaussian"
    roi_size: list[int] | None = None  # 3D window; defaults to the training patch size
    mirror_axes: list[int] = field(default_factory=list)  # test-time mirroring (not in training's validation)
    # members pooled as probabilities (mcseg.inference.members): MC-dropout samples and TTA views
    mc_samples: int = 0
    tta: list[str] = field(default_factory=list)  # [] | [flips] | [flips, noise] | [noise]
    tta_noise_std: float = 0.1
    member_seed: int = 0
    save_predictions: bool = True
    save_probabilities: bool = False
    save_dicom: bool = False  # the test evaluation's cases as DICOM too (mcseg.evaluation.dicom_cases)


@dataclass
class LoggerConfig:
    """The ``logger`` group (configs/logger/) besides its trackers (each a ``_target_`` node, :func:`check_logger`)."""

    images: int = 2  # validation overlays written per validation (TensorBoard)


def typed(node: Any, schema: type, key: str):
    """Return ``node`` as an instance of dataclass ``schema``; unknown keys or bad types raise."""
    if node is None:
        node = {}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        where = f"{key}.{exc.full_key}" if getattr(exc, "full_key", None) else key
        raise ConfigError(f"config key '{where}': {str(exc).splitlines()[0]}") from None


def _accepted_parameters(target: str, key: str) -> tuple[dict[str, inspect.Parameter], bool]:
    """The parameters of ``target`` by name (walking ``**kwargs`` up the class hierarchy, annotations resolved
    where they can be) and whether it also takes keywords it does not name."""
    module_name, _, attr = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"config key '{key}._target_': cannot import {target!r} ({exc})") from None
    found: dict[str, inspect.Parameter] = {}
    classes = inspect.getmro(obj) if inspect.isclass(obj) else (obj,)
    for cls in classes:
        fn = cls.__init__ if inspect.isclass(obj) else cls
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return found, True
        hints = _type_hints(fn)
        for p in params:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in found:
                found[p.name] = p.replace(annotation=hints.get(p.name, p.annotation))
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return found, False
    return found, True


def _type_hints(fn) -> dict:
    """``fn``'s annotations as types ({} where they cannot be resolved: then nothing is type-checked)."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation naming what the module does not import at run time
        return {}


def fits(value: Any, hint: Any) -> bool:
    """Whether a config value (plain Python: numbers, strings, lists, dicts, None) can be ``hint``; annotations
    it does not understand (callables, type variables, unresolved strings) accept anything."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    if hint in (list, tuple) or origin in (list, tuple, abc.Sequence, abc.Iterable, abc.Collection):
        members = [a for a in args if a is not Ellipsis]
        return isinstance(value, (list, tuple)) and all(any(fits(v, a) for a in members) for v in value if members)
    if hint is dict or origin in (dict, abc.Mapping):
        return isinstance(value, dict)
    if isinstance(hint, type) and hint is not object:
        if issubclass(hint, enum.Enum):
            return isinstance(value, (str, int)) and not isinstance(value, bool)
        if issubclass(hint, PurePath):
            return isinstance(value, str)
        return isinstance(value, (hint, dict))  # a dict: a node instantiated before the call
    return True


def describe_type(hint: Any) -> str:
    """``hint`` in words, for an error: ``a number``, ``a list of integers``, ``a number or a Tensor``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(describe_type(a) for a in args))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    words = {float: "a number", int: "an integer", bool: "true or false", str: "a string", type(None): "null",
             list: "a list", tuple: "a list", dict: "a mapping"}
    if hint in words:
        return words[hint]
    if origin in (list, tuple, abc.Sequence, abc.Iterable, abc.Collection):
        members = [a for a in args if a is not Ellipsis]
        plural = {"a number": "numbers", "an integer": "integers", "a string": "strings", "true or false": "booleans"}
        inner = " or ".join(dict.fromkeys(plural.get(describe_type(a), describe_type(a)) for a in members))
        return f"a list of {inner}" if inner else "a list"
    if origin in (dict, abc.Mapping):
        return "a mapping"
    return f"a {getattr(hint, '__name__', str(hint))}"


def _config_value(node: DictConfig, k: str):
    """A node's value as plain Python, interpolations resolved (``...``: not resolvable before Hydra runs)."""
    try:
        value = node[k]
    except OmegaConfBaseException:
        return ...
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def check_target_keys(node: DictConfig, key: str, ignore: tuple[str, ...] = (), imports: bool = True) -> None:
    """Every key of a ``_target_`` node must be a parameter of its target (walking ``**kwargs``), and its value
    of the parameter's annotated type where it has one (:func:`fits`). ``imports=False``: the target's parameters
    read from its source (:func:`mcseg.signatures.static_parameters`, no torch imported), the node left unchecked
    where the source does not say for certain."""
    target = node.get("_target_")
    if target is None:
        raise ConfigError(f"config key '{key}._target_' is missing")
    if imports:
        params, open_ended = _accepted_parameters(str(target), key)
    else:
        found = static_parameters(str(target))
        if found is None:
            return
        params, open_ended = found
    for k in node.keys():
        if str(k).startswith("_") or k in ignore:
            continue
        if k not in params:
            if open_ended:
                continue
            raise ConfigError(
                f"config key '{key}.{k}' is not a parameter of {target} (accepted: {', '.join(sorted(params))})"
            )
        param, value = params[k], _config_value(node, k)
        if value is ... or value is None or param.annotation is param.empty:  # null: filled in at start (in_channels)
            continue
        if not fits(value, param.annotation):
            raise ConfigError(f"config key '{key}.{k}'={value!r}: expected {describe_type(param.annotation)} "
                              f"(parameter {k} of {target})")


def check_logger(node: DictConfig | None, imports: bool = True) -> LoggerConfig:
    """The ``logger`` node: ``images``, and each tracker a ``_target_`` node (mcseg.trackers) whose keys are checked
    against its class's constructor (:func:`check_target_keys`: ``logger.wandb.mode=sometimes`` is named at
    start); null turns a tracker off."""
    node = node if node is not None else OmegaConf.create({})
    for k in node.keys():
        if k == "images" or node[k] is None:
            continue
        if not isinstance(node[k], DictConfig) or "_target_" not in node[k]:
            raise ConfigError(f"config key 'logger.{k}': expected a tracker node with a _target_ (configs/logger/) "
                              f"or null; besides its trackers the logger group has only 'images'")
        check_target_keys(node[k], f"logger.{k}", imports=imports)
    return typed({"images": node.get("images", LoggerConfig.images)}, LoggerConfig, "logger")


TOP_LEVEL = {
    "dataset", "model", "loss", "optim", "scheduler", "trainer", "inference", "evaluation",
    "logger", "paths", "task_name", "seed", "tags", "experiment", "hparams_search", "debug",
    "optimized_metric", "score", "posthoc",
    "conformal",  # checked by mcseg.cli before torch, and by mcseg.train (mcseg.conformal.config, a layer above)
    "study",  # a study preset's evaluation side (configs/experiment/study/): read and checked by
    # scripts/study_pieces.py (Study), ignored by the training
}


def validate_train_config(cfg: DictConfig, imports: bool = True) -> None:
    """Check the whole training config; raise :class:`ConfigError` naming the first bad key. ``imports=False``:
    the ``_target_`` nodes checked from their targets' source (:func:`check_target_keys`), so that ``train.py``
    refuses a typo right after Hydra composes, before torch is imported; the training checks again with them."""
    unknown = sorted(set(cfg.keys()) - TOP_LEVEL)
    if unknown:
        raise ConfigError(f"config key '{unknown[0]}' is unknown (top-level keys: {', '.join(sorted(TOP_LEVEL))})")
    from mcseg.targets import check_targets

    check_targets(cfg)
    # the plain nodes first: a _target_ node's value may be an interpolation of theirs (total_iters: max_epochs)
    typed(cfg.dataset.get("split"), SplitConfig, "dataset.split")
    typed(cfg.dataset.get("sampling"), SamplingConfig, "dataset.sampling")
    typed(cfg.trainer, TrainerConfig, "trainer")
    check_logger(cfg.logger, imports)
    typed(cfg.inference, InferenceConfig, "inference")
    typed(cfg.evaluation, EvalProtocol, "evaluation")
    for key in ("model", "loss", "optim", "scheduler"):
        check_target_keys(cfg[key], key, imports=imports)
    check_target_keys(cfg.dataset, "dataset", ignore=("split", "sampling"), imports=imports)


# What of a config decides a checkpoint's model: compared when a run resumes (mcseg.training.relaunch) and when
# a checkpoint is evaluated beside its run's own (mcseg.evaluation.checkpoint).
# Config sections that must match between a checkpoint and the run resuming from it.
RESUME_MUST_MATCH = ("model", "loss", "optim", "scheduler", "seed", "dataset")
# Dataset keys that may change on resume: where the data lives and how it is cached and loaded,
# not what the model sees (the data itself is compared through the facts recorded from it; a
# resumed run reads its own split.json, whatever split.file says).
DATASET_MAY_CHANGE = ("root", "split.file", "preprocess.cache", "preprocess.cache_dir", "preprocess.workers",
                      "sampling.num_workers", "sampling.device_cache")


def _without(node: dict | None, dotted: tuple[str, ...]) -> dict | None:
    if not isinstance(node, dict):
        return node
    node = {k: dict(v) if isinstance(v, dict) else v for k, v in node.items()}
    for key in dotted:
        *parents, leaf = key.split(".")
        parent = node
        for name in parents:
            parent = parent.get(name) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(leaf, None)
    return node


def _first_difference(saved, now, prefix: str, owners: tuple[str, str] | None = None) -> str | None:
    """The first dotted key at which two config nodes differ; ``owners`` names whose each value is
    (``saved``'s, ``now``'s), else ``now`` is the launch's and ``saved`` the checkpoint's."""
    if isinstance(saved, dict) and isinstance(now, dict):
        for key in sorted(saved.keys() | now.keys()):
            found = _first_difference(saved.get(key), now.get(key), f"{prefix}.{key}", owners)
            if found:
                return found
        return None
    if saved == now:
        return None
    if owners:
        return f"{prefix}={saved!r} in {owners[0]}, {now!r} in {owners[1]}"
    return f"{prefix}={now!r} (checkpoint: {saved!r})"


def resume_mismatch(saved: dict, now: dict, owners: tuple[str, str] | None = None) -> str | None:
    """Where the resolved config ``now`` differs from a checkpoint's ``saved`` one in :data:`RESUME_MUST_MATCH`
    (``owners``: whose each config is, for two configs of which neither is the launch's)."""
    for key in RESUME_MUST_MATCH:
        a, b = saved.get(key), now.get(key)
        if key == "dataset":
            a, b = _without(a, DATASET_MAY_CHANGE), _without(b, DATASET_MAY_CHANGE)
        found = _first_difference(a, b, key, owners)
        if found:
            return found
    return None

"""What a training config alone can refuse beyond its schemas (:func:`mcseg.config.validate_train_config`): the
``posthoc`` node (:class:`~mcseg.calibration.posthoc_config.PosthocConfig`; each applied scaler also fitted; LTS
in the model's geometry), the ``score`` weights, the metric a sweep optimises (``optimized_metric``) and the one
that selects best.pt (``trainer.monitor``). Torch-free (scaler names: :mod:`mcseg.calibration.scaler_names`;
figure names: :mod:`mcseg.evaluation.headline`): ``train.py`` runs it right after Hydra composes
(:func:`mcseg.cli.train_checked`), :func:`mcseg.training.build.build_run` again before any data is read.
"""
from __future__ import annotations

from numbers import Real

from omegaconf import DictConfig

from mcseg.calibration.posthoc_config import PosthocConfig
from mcseg.config import typed
from mcseg.errors import ConfigError
from mcseg.evaluation.headline import HEADLINE_KEYS

__all__ = ["OPTIMIZED_PREFIXES", "check_training_config", "optimized_metrics"]

#: what ``train()`` returns of a headline figure, as ``<prefix>/<key>``: the last validation (``val``, ``val_full``),
#: that of the best epoch (``best_val``, ``best_val_full``), the test split (``test``; ``test_<scaler>`` after each
#: applied post-hoc scaler)
OPTIMIZED_PREFIXES = ("val", "val_full", "best_val", "best_val_full", "test")


def optimized_metrics(posthoc: PosthocConfig) -> tuple[str, ...]:
    """The values ``optimized_metric`` may take: ``score`` (the weighted validation score, mcseg.train), or a
    headline figure as ``train()`` returns it (:data:`OPTIMIZED_PREFIXES`)."""
    prefixes = OPTIMIZED_PREFIXES + tuple(f"test_{name}" for name in posthoc.apply)
    return ("score", *(f"{prefix}/{key}" for prefix in prefixes for key in HEADLINE_KEYS))


def check_training_config(cfg: DictConfig) -> PosthocConfig:
    """Refuse, naming the key, what :mod:`this module <mcseg.training.config_checks>` checks; return the typed
    ``posthoc`` node."""
    posthoc: PosthocConfig = typed(cfg.get("posthoc"), PosthocConfig, "posthoc")
    if set(posthoc.apply) - set(posthoc.fit):
        raise ConfigError(f"config key 'posthoc.apply'={posthoc.apply}: each applied scaler must also be in "
                          f"posthoc.fit={posthoc.fit} (training fits them on the validation split)")
    if "lts" in posthoc.fit:  # its settings in the model's geometry: refused now, not after training
        sampling = cfg.dataset.sampling
        posthoc.lts_config(sampling.dims, sampling.patch_size, sampling.get("slice_axis", -1))
    score = cfg.get("score") or {}
    unknown = sorted(set(score) - set(HEADLINE_KEYS))
    if unknown:
        raise ConfigError(f"config key 'score.{unknown[0]}': not a validation metric (expected "
                          f"{', '.join(HEADLINE_KEYS)})")
    for key, weight in score.items():
        if isinstance(weight, bool) or not isinstance(weight, Real):
            raise ConfigError(f"config key 'score.{key}'={weight!r}: expected a number (its weight in the score)")
    metric = cfg.get("optimized_metric")
    if metric is not None and metric not in optimized_metrics(posthoc):
        raise ConfigError(f"config key 'optimized_metric'={metric}: not a figure train() returns (expected score, "
                          f"or <prefix>/<key> with a prefix of {', '.join(OPTIMIZED_PREFIXES)}"
                          f"{', test_<scaler of posthoc.apply>' if posthoc.apply else ''} and a key of "
                          f"{', '.join(HEADLINE_KEYS)})")
    # what selects best.pt: a validation figure as the trainer records it (val/<key>, val_full/<key>) or a training
    # one (train/loss); a typo would train to the end and keep the last epoch
    monitor = str(cfg.trainer.monitor)
    prefix, _, key = monitor.partition("/")
    if prefix not in ("val", "val_full", "train") or (prefix != "train" and key not in HEADLINE_KEYS):
        raise ConfigError(f"config key 'trainer.monitor'={monitor}: not a validation metric (expected val/<key> or "
                          f"val_full/<key> with a key of {', '.join(HEADLINE_KEYS)}, or a train/ metric)")
    return posthoc

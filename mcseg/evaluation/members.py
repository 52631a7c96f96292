"""What evaluate.py asks of a predictor's members beyond the run's own inference: another test-time mirroring,
MC-dropout samples, TTA views, a member seed, and scaling each network before pooling; and the folder tags that
tell such predictors apart (a checkpoint's and an ensemble's alike)."""
from __future__ import annotations

from dataclasses import replace

from omegaconf import DictConfig

from mcseg.calibration import PosthocConfig
from mcseg.config import InferenceConfig, typed
from mcseg.errors import ConfigError

__all__ = ["MEMBER_KEYS", "member_settings", "member_tag", "members_as_asked", "mirrored_as_asked",
           "pooled_after_tag"]


def mirrored_as_asked(cfg: DictConfig, inference: InferenceConfig) -> InferenceConfig:
    """The run's inference settings, with evaluate.py's ``mirror_axes`` where given.

    The run's post-hoc fit was made on the logits of the run's own mirroring, so another mirroring
    is evaluated without post-hoc scalers (``posthoc.apply=[]``), which is refused otherwise.
    """
    axes = cfg.get("mirror_axes")
    if axes is None or list(axes) == list(inference.mirror_axes):
        return inference
    posthoc = typed(cfg.posthoc, PosthocConfig, "posthoc")
    if posthoc.apply:
        raise ConfigError(f"config key 'mirror_axes'={list(axes)}: the run's post-hoc scalers were fitted on "
                          f"logits with inference.mirror_axes={list(inference.mirror_axes)}; "
                          "add posthoc.apply=[] to evaluate another mirroring")
    return replace(inference, mirror_axes=[int(a) for a in axes])


MEMBER_KEYS = ("mc_samples", "tta", "tta_noise_std", "member_seed")


def member_settings(inference: InferenceConfig) -> tuple:
    return tuple(tuple(v) if isinstance(v, list) else v for v in (getattr(inference, k) for k in MEMBER_KEYS))


def member_tag(inference: InferenceConfig) -> str:
    """A folder-name tag of the members: ``tta-flips+noise``, ``mc8``, ``tta-flips-mc8``; ``single``."""
    parts = ([f"tta-{'+'.join(inference.tta)}"] if inference.tta else []) \
        + ([f"mc{inference.mc_samples}"] if inference.mc_samples else [])
    if inference.tta and "noise" in inference.tta and inference.tta_noise_std != 0.1:
        parts.append(f"sd{inference.tta_noise_std:g}")
    if inference.member_seed:
        parts.append(f"seed{inference.member_seed}")
    return "-".join(parts) or "single"


def pooled_after_tag(tag: str | None, cfg: DictConfig) -> str | None:
    """``tag`` with ``-pool-after`` when members are scaled before they are pooled (``posthoc.pool=after``):
    the same members scaled the other way are another predictor, so another folder (``pool-after`` alone for
    an ensemble of plain networks)."""
    if typed(cfg.posthoc, PosthocConfig, "posthoc").pool != "after":
        return tag
    return f"{tag}-pool-after" if tag else "pool-after"


def members_as_asked(cfg: DictConfig, inference: InferenceConfig) -> InferenceConfig:
    """The run's inference settings with evaluate.py's ``mc_samples``, ``tta``, ``tta_noise_std`` and
    ``member_seed`` where given (null: the run's)."""
    asked = {k: cfg.get(k) for k in MEMBER_KEYS if cfg.get(k) is not None}
    mc = asked.get("mc_samples")
    if mc is not None and (isinstance(mc, bool) or not isinstance(mc, int) or mc < 0 or mc == 1):
        raise ConfigError(f"config key 'mc_samples'={mc}: expected an integer >= 2 (MC-dropout passes), "
                          "or 0 for none")
    if "tta" in asked:
        asked["tta"] = [str(t) for t in asked["tta"]]
    return replace(inference, **asked) if asked else inference

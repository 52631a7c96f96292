"""The ``posthoc`` config node (configs/posthoc/default.yaml), typed and checked without importing torch: scaler
names (:data:`~mcseg.calibration.scaler_names.SCALER_FACTS`), voxels, objective, the LTS settings
(:class:`~mcseg.calibration.lts_config.LTSConfig`) and the names of Fiducio's fit settings are refused right after
Hydra composes (``mcseg.cli``; docs/benchmarks.md, "Start-up"). The values of Fiducio's settings are checked by its
calibrators' own constructors, imported only when a Fiducio scaler is fitted with settings of its own. What the
fit does with it: :mod:`mcseg.calibration.posthoc`.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from mcseg.calibration.lts_config import LTSConfig
from mcseg.calibration.scaler_names import FIDUCIO_SETTINGS, SCALER_FACTS, ScalerFacts, softmax_only_message
from mcseg.errors import ConfigError

__all__ = ["LTS_GEOMETRY", "OBJECTIVES", "PosthocConfig", "VOXEL_SAMPLES", "facts_of", "scaler_facts"]

VOXEL_SAMPLES = ("balanced", "all", "region")
OBJECTIVES = ("nll", "ece")
# posthoc.lts keys taken from the model's sampling geometry (dataset.sampling) when not set
LTS_GEOMETRY = ("dims", "patch_size", "slice_axis")


def facts_of(cls) -> ScalerFacts:
    """What the config checks read of the scaler class ``cls``."""
    return ScalerFacts(cls.preserves_argmax, cls.fitted_on, tuple(cls.objectives), cls.softmax_only,
                       hasattr(cls, "calibrator_class"))


def scaler_facts(names: Iterable[str]) -> dict[str, ScalerFacts]:
    """Name -> facts of every scaler, enough to check ``names``: :data:`SCALER_FACTS` (no torch) when each of
    ``names`` has a line there and the registry is not imported; else the registry's own classes (imported here:
    a scaler added as one class and one entry of ``SCALER_TYPES``, or registered at run time, is known; a misspelt
    name is refused after that import)."""
    if all(name in SCALER_FACTS for name in names) and "mcseg.calibration.scaler_registry" not in sys.modules:
        return SCALER_FACTS
    from mcseg.calibration.scaler_registry import SCALER_TYPES

    return {name: facts_of(cls) for name, cls in SCALER_TYPES.items()}



@dataclass
class PosthocConfig:
    """Mirrors the config node ``posthoc`` (configs/posthoc/default.yaml)."""

    fit: list[str] = field(default_factory=lambda: ["temperature"])
    apply: list[str] = field(default_factory=lambda: ["temperature"])
    max_voxels: int = 2_000_000
    max_iter: int = 100
    seed: int = 0
    refit: bool = False
    voxels: str = "region"    # region (evaluation.region of the model's own prediction) | balanced | all
    objective: str = "nll"    # nll | ece (temperature only)
    lts: dict[str, Any] = field(default_factory=dict)  # LTSConfig fields; dims, patch_size, slice_axis: the model's
    histogram_bins: int = 15  # equal-width bins of histogram binning (histogram, histogram_top)
    # how Fiducio's calibrators are fitted (FIDUCIO_SETTINGS: optimizer, lr, max_iter, lambda_reg, mu_reg);
    # {}: the library's defaults. A calibrator is given those its constructor takes (ETS has no regulariser)
    fiducio: dict[str, Any] = field(default_factory=dict)
    # predictors of several members (ensembles, TTA, MC dropout): fit the scaler on the pooled prediction
    # (before) or apply each network's own fit to its members before pooling (after); Rahaman & Thiery 2021
    pool: str = "before"

    def __post_init__(self) -> None:
        if self.pool not in ("before", "after"):
            raise ConfigError(f"config key 'posthoc.pool': expected before or after, got {self.pool!r}")
        facts = scaler_facts([*self.fit, *self.apply])
        for key in ("fit", "apply"):
            bad = [s for s in getattr(self, key) if s not in facts]
            if bad:
                raise ConfigError(f"config key 'posthoc.{key}': unknown scaler {bad[0]!r} "
                                  f"(expected {', '.join(facts)})")
        if self.voxels not in VOXEL_SAMPLES:
            raise ConfigError(f"config key 'posthoc.voxels': expected one of {', '.join(VOXEL_SAMPLES)}, "
                              f"got {self.voxels!r}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"config key 'posthoc.objective': expected one of {', '.join(OBJECTIVES)}, "
                              f"got {self.objective!r}")
        unable = [s for s in self.fit if self.objective not in facts[s].objectives]
        if unable:
            raise ConfigError(f"config key 'posthoc.objective'={self.objective}: scaler {unable[0]!r} is fitted by "
                              f"{' or '.join(facts[unable[0]].objectives)} only; remove it from posthoc.fit "
                              f"or set posthoc.objective=nll")
        # The region is picked with the model's own prediction; a scaler that moves the arg-max moves the
        # region, and everything outside it (never seen by the fit) can change class: in the study of
        # docs/results.md vector scaling fitted there took the mean test Dice of 15 runs from 0.843 to 0.554.
        moving = [s for s in self.fit if self.voxels == "region" and not facts[s].preserves_argmax
                  and facts[s].fitted_on == "voxels"]
        if moving:
            raise ConfigError(f"config key 'posthoc.voxels'=region: {moving[0]!r} scaling can change the arg-max, "
                              f"so the region it would be fitted on is not where it is scored and voxels outside it "
                              f"change class; fit it on balanced or all voxels, or remove it from posthoc.fit")
        if self.max_voxels < 1 or self.max_iter < 1 or self.histogram_bins < 1:
            raise ConfigError("config keys 'posthoc.max_voxels', 'posthoc.max_iter' and 'posthoc.histogram_bins' "
                              "must be >= 1")
        unknown = sorted(set(self.fiducio) - set(FIDUCIO_SETTINGS))
        if unknown:
            raise ConfigError(f"config key 'posthoc.fiducio.{unknown[0]}': not a Fiducio fit setting (expected "
                              f"{', '.join(FIDUCIO_SETTINGS)})")
        fiducio = [s for s in self.fit if facts[s].fiducio]
        if self.fiducio and fiducio:  # their values, by the calibrators' own constructors (Fiducio imports torch)
            from mcseg.calibration.fiducio_adapters import check_fiducio_settings

            check_fiducio_settings(self.fiducio, fiducio)
        known = {f.name for f in fields(LTSConfig)}
        unknown = sorted(set(self.lts) - known)
        if unknown:
            raise ConfigError(f"config key 'posthoc.lts.{unknown[0]}': not an LTS setting (expected "
                              f"{', '.join(sorted(known))})")

    def check_outputs(self, multilabel: bool) -> None:
        """Refuse, before any work, a scaler of ``fit`` that a model of these outputs cannot take (the binning
        scalers calibrate a softmax's classes, not independent sigmoid regions)."""
        facts = scaler_facts(self.fit)
        unable = [s for s in self.fit if multilabel and facts[s].softmax_only]
        if unable:
            raise ConfigError(softmax_only_message(unable[0], f"config key 'posthoc.fit'={self.fit}"))

    def lts_config(self, dims: int, patch_size: list[int] | None, slice_axis: int) -> LTSConfig:
        """The LTS settings: ``posthoc.lts``, with the model's geometry where it leaves one unset (null)."""
        geometry = {"dims": dims, "patch_size": list(patch_size) if patch_size else None, "slice_axis": slice_axis}
        chosen = {k: v for k, v in self.lts.items() if v is not None}
        merged = {**{k: v for k, v in geometry.items() if v is not None}, **chosen}
        try:
            return LTSConfig(**merged)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"config key 'posthoc.lts': {exc}") from None

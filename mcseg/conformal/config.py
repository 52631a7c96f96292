"""The ``conformal`` config node (configs/conformal/default.yaml) of ``train.py`` and ``evaluate.py``, typed and
checked: names, ranges and a loss its method cannot control (:func:`~mcseg.conformal.control.controllable`) are
refused right after Hydra composes, before torch is imported (``mcseg.cli``; docs/benchmarks.md, "Start-up").
Torch-free, as what it reads is: the losses and policies of :mod:`~mcseg.conformal.risks`, the methods of
:mod:`~mcseg.conformal.control`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mcseg.config import typed
from mcseg.conformal.control import FWER_METHODS, METHODS, RCPS_BOUNDS, NotMonotone, controllable
from mcseg.conformal.risks import ABSENT_POLICIES, LOSSES
from mcseg.errors import ConfigError

if TYPE_CHECKING:
    from mcseg.conformal.fit import ConformalSettings

__all__ = ["ALPHAS", "REPEATS", "ConformalConfig", "conformal_config"]

# the defaults of conformal.repeats / --repeats and of the levels besides the fit's own alpha (docs/conformal.md):
# 200 splits put the Monte-Carlo standard error of a violation rate near 0.1 at 0.02 (mcseg.conformal.validity)
REPEATS, ALPHAS = 200, (0.05, 0.1, 0.2)


@dataclass
class ConformalConfig:
    """Mirrors the config node ``conformal`` (configs/conformal/default.yaml)."""

    enabled: bool = False
    alpha: float = 0.1
    method: str = "crc"
    loss: str = "fnr"
    delta: float | None = None
    rcps_bound: str = "wsr"
    fwer: str = "bonferroni_holm"
    absent: str = "skip"
    grid_size: int = 101
    tau: float = 1.0
    classes: list[str] | None = None
    posthoc: bool = True
    masks: bool = True
    figures: int = 0  # how many test cases get an overlay figure <case>_conformal.png (over their image)
    repeats: int = REPEATS  # random re-splits of the pooled validation and test cases (0: none): validity.csv
    alphas: list[float] = field(default_factory=lambda: list(ALPHAS))  # their levels, with alpha
    statements: bool = False  # the new-case statements (mcseg.statements) of each test case: <source>/statements/
    floor: float = 0.7  # their review flag's failure: a structure's Dice below this

    def __post_init__(self) -> None:
        for key, allowed in (("method", METHODS), ("loss", tuple(LOSSES)), ("rcps_bound", RCPS_BOUNDS),
                             ("fwer", FWER_METHODS), ("absent", tuple(ABSENT_POLICIES))):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"config key 'conformal.{key}': expected one of {', '.join(allowed)}, "
                                  f"got {getattr(self, key)!r}")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"config key 'conformal.alpha': expected 0 < alpha < 1, got {self.alpha}")
        try:  # what the threshold fit would refuse after the whole evaluation
            controllable(self.loss, self.method)
        except NotMonotone as exc:
            raise ConfigError(f"config key 'conformal.loss'={self.loss} with conformal.method={self.method}: {exc} "
                              f"(conformal.method=ltt with conformal.delta), or conformal.loss=fnr") from None
        if self.method == "crc" and self.delta is not None:
            raise ConfigError("config key 'conformal.delta': belongs to method rcps or ltt; CRC controls the "
                              "expected loss")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ConfigError(f"config key 'conformal.delta': expected 0 < delta < 1, got {self.delta}")
        if self.repeats < 0:
            raise ConfigError(f"config key 'conformal.repeats': expected >= 0 (0: no re-splits), got {self.repeats}")
        if any(not 0 < a < 1 for a in self.alphas):
            raise ConfigError(f"config key 'conformal.alphas': expected each 0 < alpha < 1, got {list(self.alphas)}")
        if not 0 <= self.floor <= 1:
            raise ConfigError(f"config key 'conformal.floor': expected a Dice in [0, 1], got {self.floor}")

    def settings(self, class_names: list[str], multilabel: bool) -> ConformalSettings:
        from mcseg.conformal.fit import ConformalSettings, class_indices  # torch: at evaluation, not at the check

        try:
            classes = class_indices(self.classes, class_names, multilabel)
        except ValueError as exc:
            raise ConfigError(f"config key 'conformal.classes': {exc}") from None
        delta = self.delta if self.delta is not None or self.method == "crc" else 0.1
        return ConformalSettings(alpha=self.alpha, delta=delta, method=self.method, loss=self.loss,
                                 absent=self.absent, rcps_bound=self.rcps_bound, fwer=self.fwer, tau=self.tau,
                                 classes=classes)


def conformal_config(cfg) -> ConformalConfig:
    """An entry point's ``conformal`` node (configs/conformal/default.yaml), typed and checked: refused at start."""
    return typed(cfg.get("conformal"), ConformalConfig, "conformal")

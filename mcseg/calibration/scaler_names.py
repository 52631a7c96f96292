"""Every post-hoc scaler's name and what the config checks read of it, without importing torch or Fiducio.

:data:`SCALER_FACTS` lists, in :data:`~mcseg.calibration.scaler_registry.SCALER_TYPES`'s order, each scaler's name
(as in ``posthoc.fit``, ``posthoc.apply`` and ``mcseg-calibrate-folder --scaler``) and the class attributes that
:class:`~mcseg.calibration.posthoc_config.PosthocConfig` checks a config against: whether it keeps the arg-max,
what it is fitted on, by which objectives, whether it calibrates a softmax only and whether it is a Fiducio
calibrator (fitted with ``posthoc.fiducio``). The classes import torch (and Fiducio), whose import takes seconds:
with this table ``train.py`` and ``evaluate.py`` refuse a misspelt scaler right after Hydra composes
(docs/benchmarks.md, "Start-up"). tests/test_startup.py checks that each line equals what its class says. A
new scaler is still one class and its entry in the registry (README, "Extending mcseg"): a name without a line here
is looked up in the registry itself (:func:`mcseg.calibration.posthoc_config.scaler_facts`, which imports it
then), as is every name once the
registry is imported (a scaler registered at run time).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FIDUCIO_SETTINGS", "SCALER_FACTS", "ScalerFacts", "softmax_only_message"]


@dataclass(frozen=True)
class ScalerFacts:
    """What the config checks read of a scaler class (its class attributes of the same names; ``fiducio``: it has a
    ``calibrator_class``)."""

    preserves_argmax: bool
    fitted_on: str = "voxels"
    objectives: tuple[str, ...] = ("nll",)
    softmax_only: bool = False
    fiducio: bool = False


_BINNING = ScalerFacts(preserves_argmax=False, softmax_only=True)


def _fiducio(keeps_argmax: bool) -> ScalerFacts:
    return ScalerFacts(preserves_argmax=keeps_argmax, softmax_only=True, fiducio=True)


#: scaler name -> facts, in the registry's order (mcseg.calibration.scaler_registry)
SCALER_FACTS: dict[str, ScalerFacts] = {
    "temperature": ScalerFacts(preserves_argmax=True, objectives=("nll", "ece")),
    "vector": ScalerFacts(preserves_argmax=False),
    "lts": ScalerFacts(preserves_argmax=True, fitted_on="cases"),
    "histogram": _BINNING, "histogram_top": _BINNING, "isotonic": _BINNING, "isotonic_top": _BINNING,
    "ets": _fiducio(True), "ms": _fiducio(False), "msc": _fiducio(False), "dirichlet": _fiducio(False),
    "cms": _fiducio(False), "cmsap": _fiducio(True), "cmsop": _fiducio(True),
}

#: the fit settings ``posthoc.fiducio`` may set (keyword arguments of Fiducio's constructors)
FIDUCIO_SETTINGS = ("optimizer", "lr", "max_iter", "lambda_reg", "mu_reg")


def softmax_only_message(name: str, key: str) -> str:
    """Why ``name`` (a scaler whose ``softmax_only`` is set) is refused for a multi-label model; ``key``: where it
    was asked for."""
    return (f"{key}: post-hoc scaler {name!r} calibrates a softmax only; this model predicts independent (sigmoid) "
            f"regions, one sigmoid per region (multi-label): use temperature, vector or lts")

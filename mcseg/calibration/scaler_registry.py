"""Every post-hoc scaler by name: ``SCALER_TYPES`` maps a name (as in ``posthoc.fit`` and
``mcseg-calibrate-folder --scaler``) to its class. The interface and the temperature family are in
:mod:`mcseg.calibration.scaler_interface`, histogram binning and isotonic regression in
:mod:`mcseg.calibration.binning_adapters`, Fiducio's calibrators in :mod:`mcseg.calibration.fiducio_adapters`;
a new scaler is a class in one of those (or a module of its own) and an entry here.
"""
from __future__ import annotations

from pathlib import Path

from mcseg.registry import unique
from mcseg.calibration.binning_adapters import BINNING_SCALERS
from mcseg.calibration.fiducio_adapters import FIDUCIO_SCALER_TYPES
from mcseg.calibration.scaler_interface import FitData, FitOptions, LTSScaler, Scaler, TemperatureScaler, VectorScaler

SCALER_TYPES: dict[str, type[Scaler]] = unique(
    (TemperatureScaler, VectorScaler, LTSScaler, *BINNING_SCALERS, *FIDUCIO_SCALER_TYPES.values()),
    lambda scaler: scaler.name, "post-hoc scaler")


def build_scaler(name: str, options: FitOptions | None = None) -> Scaler:
    """A new, unfitted scaler ``name`` set up by ``options`` (defaults: :class:`FitOptions`)."""
    if name not in SCALER_TYPES:
        raise ValueError(f"post-hoc scaler {name!r}: expected one of {', '.join(SCALER_TYPES)}")
    return SCALER_TYPES[name].configured(options or FitOptions())


def load_scaler(name: str, record: dict, directory: Path) -> Scaler:
    """The fitted scaler ``name`` from its calibration.json ``record`` (files under ``directory``)."""
    if name not in SCALER_TYPES:
        raise ValueError(f"calibration.json: unknown post-hoc scaler {name!r} (expected one of "
                         f"{', '.join(SCALER_TYPES)}); refit with posthoc.refit=true")
    return SCALER_TYPES[name].load(record, directory)


__all__ = ["FitData", "FitOptions", "LTSScaler", "SCALER_TYPES", "Scaler", "TemperatureScaler", "VectorScaler",
           "build_scaler", "load_scaler"]

"""Post-hoc calibration: temperature, vector and local temperature scaling fitted on the validation split.

The names below are imported at first use: most need torch, and the config checks (``posthoc_config``,
``scaler_names``, ``lts_config``: torch-free) read this package before torch is imported (docs/benchmarks.md,
"Start-up").
"""
from __future__ import annotations

import importlib

_WHERE = {
    "CALIBRATION_FILE": "posthoc", "fit_posthoc": "posthoc", "load_calibration": "posthoc",
    "scalers_to_apply": "posthoc", "PosthocConfig": "posthoc_config",
    "SCALER_TYPES": "scaler_registry", "Scaler": "scaler_registry",
    "SCALERS": "logit_scaling", "fit_scaler": "logit_scaling", "nll": "logit_scaling", "scale_logits": "logit_scaling",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

"""Conformal guarantees on any model's probabilities, per case (cases are the exchangeable units, never voxels):
risk control of per-class thresholded sets (CRC, RCPS, Learn-then-Test) and conformal margins in mm.

* :mod:`~mcseg.conformal.risks`: per-case FNR / FDR of ``{p_k >= t}`` on a threshold grid, one pass per case.
* :mod:`~mcseg.conformal.control`: one threshold from a per-case loss table (CRC, RCPS, LTT).
* :mod:`~mcseg.conformal.margins`: outer / inner margins in mm, their conformal quantile, grown and shrunk masks.
* :mod:`~mcseg.conformal.fit`: per class, from case summaries; the sets of a new case and their test figures.
* :mod:`~mcseg.conformal.validity`: the guarantee checked over many random calibration / test splits.
* :mod:`~mcseg.conformal.record`: what conformal.json says; :mod:`~mcseg.conformal.plots`: the figures.

Entry points: ``mcseg-conformal-folder`` (:mod:`mcseg.conformal_folder`), ``evaluate.py conformal.enabled=true``
(:mod:`mcseg.evaluation.conformal`), ``scripts/conformal_validity.py``; docs/conformal.md.
"""
from __future__ import annotations

import importlib

from mcseg.conformal.control import METHODS, NotMonotone, ThresholdFit, control
from mcseg.conformal.risks import ABSENT_POLICIES, LOSSES, case_counts, default_thresholds, loss_table

# imported at first use: mcseg.conformal.fit needs torch, and the config checks (mcseg.conformal.config: the losses
# and methods above, torch-free) read this package before torch is imported (docs/benchmarks.md, "Start-up")
_FIT = ("CaseSummary", "ConformalSettings", "case_sets", "case_test", "fit_margins", "fit_thresholds",
        "predicted_masks", "summarise")

__all__ = ["ABSENT_POLICIES", "CaseSummary", "ConformalSettings", "LOSSES", "METHODS", "NotMonotone", "ThresholdFit",
           "case_counts", "case_sets", "case_test", "control", "default_thresholds", "fit_margins", "fit_thresholds",
           "loss_table", "predicted_masks", "summarise"]


def __getattr__(name: str):
    if name not in _FIT:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.fit"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FIT))

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

# name -> its module; imported at first use, so that the config checks (mcseg.conformal.config: losses, methods)
# read this package without torch, which mcseg.conformal.fit needs (docs/benchmarks.md, "Start-up")
_WHERE = {
    **dict.fromkeys(("METHODS", "NotMonotone", "ThresholdFit", "control"), "control"),
    **dict.fromkeys(("CaseSummary", "ConformalSettings", "case_sets", "case_test", "fit_margins", "fit_thresholds",
                     "predicted_masks", "summarise"), "fit"),
    **dict.fromkeys(("ABSENT_POLICIES", "LOSSES", "case_counts", "default_thresholds", "loss_table"), "risks"),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

"""ROOD-MRI's robustness scores of a metric over corruption levels (Boone et al., NeuroImage 2023).

With ``m_0`` the clean value, ``m_s`` the value at level ``s`` (a mean over cases) and level weights
``w_s = alpha ** s`` (ROOD-MRI: ``alpha = 2/3``), per corruption:

* **overall** ``= (m_0 + sum_s w_s m_s) / (1 + sum_s w_s)``: the weighted mean of the clean and
  corrupted values, the clean one with weight 1;
* **degradation** ``= sum_s w_s (m_0 - m_s) / sum_s w_s`` for a metric where higher is better (Dice),
  ``sum_s w_s (m_s - m_0) / sum_s w_s`` where lower is better (HD95, ECE, NLL): positive when the
  corruption makes it worse, in the metric's own units;

both then averaged over corruptions (roodmri/metrics/calculate.py). The sums run over the levels
evaluated: a subset of levels gives scores of that subset, not comparable to the full suite's.
A value that is missing or not finite (e.g. HD95 of a case with nothing predicted) makes its
corruption's scores None, and the average over corruptions is then taken over those that have one,
with their number recorded.
"""
from __future__ import annotations

import math
from collections.abc import Mapping


def level_weights(levels, alpha: float = 2 / 3) -> dict[int, float]:
    """``{s: alpha ** s}`` for the corrupted levels (0 is the clean value, weight 1 in the overall score)."""
    return {int(s): float(alpha) ** int(s) for s in levels if int(s) > 0}


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def robustness(values: Mapping[int, float | None], higher_is_better: bool, alpha: float = 2 / 3
               ) -> dict[str, float | None]:
    """``{"overall", "degradation"}`` of one corruption's ``{level: value}`` (level 0: clean)."""
    values = {int(k): v for k, v in values.items()}
    weights = level_weights([s for s in values if s > 0], alpha)
    if 0 not in values or not weights or not all(_finite(values[s]) for s in [0, *weights]):
        return {"overall": None, "degradation": None}
    m0 = float(values[0])
    total = sum(weights.values())
    overall = (m0 + sum(w * values[s] for s, w in weights.items())) / (1 + total)
    sign = 1.0 if higher_is_better else -1.0
    degradation = sum(w * sign * (m0 - values[s]) for s, w in weights.items()) / total
    return {"overall": overall, "degradation": degradation}


def suite_robustness(table: Mapping[str, Mapping[int, float | None]], higher_is_better: bool,
                     alpha: float = 2 / 3) -> dict:
    """Per corruption (``table``: corruption -> {level: value}) and averaged over the corruptions that have one."""
    per = {name: robustness(levels, higher_is_better, alpha) for name, levels in table.items()}
    out: dict = {"per_corruption": per}
    for key in ("overall", "degradation"):
        have = [r[key] for r in per.values() if r[key] is not None]
        out[key] = sum(have) / len(have) if have else None
    out["corruptions_scored"] = sum(r["overall"] is not None for r in per.values())
    return out

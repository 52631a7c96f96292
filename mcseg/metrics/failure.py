"""Does the uncertainty find the errors? Voxel-level and case-level failure detection.

Voxel level (errors: voxels whose arg-max differs from the label, inside failure detection's voxel region:
by default the calibration region, ``all`` for the whole image as Jungo & Reyes):

* :func:`auroc` — the AUROC of an uncertainty map for the error voxels (positives: errors, score: the
  uncertainty), ties counted half (the Mann-Whitney statistic with average ranks). It equals fd-shifts'
  ``failauc`` (positives: correct voxels, score: the confidence ``-u``). Exact per case;
  :class:`PooledAUROC` pools a split over ``bins`` equal-width bins of the normalised uncertainty in
  [0, 1] (ties within a bin counted half), so its memory does not grow with the voxels.
* :func:`ue_dice` — Jungo & Reyes (MICCAI 2019): :math:`\\mathrm{UE\\text{-}Dice}(t) = 2|U_t \\cap E| / (|U_t| + |E|)`
  with :math:`U_t = \\{u > t\\}` (strict) on an uncertainty normalised to [0, 1], 1 when both sets are empty,
  at their 11 thresholds :data:`UEO_THRESHOLDS`. :func:`ueo`: the maximum over t of the **dataset mean**
  UE-Dice, with the threshold that reaches it (chosen per method over the cases, not per case).

Case level (fd-shifts, Traub et al. 2024; risk of a case and its confidence, e.g. minus its aggregated
uncertainty). :data:`RISKS`: ``macro``, 1 - the mean over foreground classes of their Dice (mcseg's
``mean_foreground_dice``), or ``micro``, 1 - :func:`micro_foreground_dice` (ValUES, Kahl et al. ICLR 2024:
torchmetrics' ``dice(ignore_index=0)``, whose default average is micro):

* the risk-coverage curve and its areas (AURC, E-AURC, AUGRC, ...) of the case risks and confidences:
  :mod:`mcseg.metrics.risk_coverage`.
* :func:`aggregate_uncertainty` — ValUES' case scores of a voxel map: its sum over the image, the largest sum
  over ``patch``-voxel windows (10 per axis, cut to the image where it is smaller), or the mean of the voxels
  at or above a threshold taken from the validation split (0 when none is).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mcseg.metrics.risk_coverage import achievable_aurc, area_cis, augrc, aurc, eaugrc, eaurc

UEO_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
#: a case's risk: 1 - its macro (mean over foreground classes) or micro (over foreground voxels) Dice
RISKS = {"macro": "1 - macro foreground Dice: the mean over foreground classes of the case's Dice "
                  "(mean_foreground_dice; classes absent from label and prediction left out)",
         "micro": "1 - micro foreground Dice: 2 sum_c |P_c & L_c| / sum_c (|P_c| + |L_c|) over the foreground "
                  "classes c (ValUES: torchmetrics dice, ignore_index=0, micro average)"}


# ------------------------------------------------------------------------------------------- voxel level
def auroc(scores: torch.Tensor, positives: torch.Tensor) -> float:
    """AUROC of ``scores`` for ``positives`` (bool, same shape), ties counted half; NaN without both classes.

    :math:`(R_+ - n_+(n_+ + 1)/2) / (n_+ n_-)` with :math:`R_+` the sum of the positives' average ranks.
    """
    scores, positives = scores.reshape(-1).double(), positives.reshape(-1).bool()
    n_pos = int(positives.sum())
    n_neg = positives.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    values, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average_rank = ends - (counts.double() - 1) / 2  # 1-based mean rank of each distinct value
    rank_sum = average_rank[inverse][positives].sum().item()
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


class PooledAUROC:
    """The AUROC of an uncertainty in [0, 1] for the error voxels of a whole split, from two histograms
    (errors, correct) over ``bins`` equal-width bins: call :meth:`update` per case, then :meth:`aggregate`."""

    def __init__(self, bins: int = 1 << 16) -> None:
        if bins < 2:
            raise ValueError(f"bins={bins}: expected at least 2")
        self.bins = bins
        self.reset()

    HISTOGRAMS = ("errors", "correct")

    def reset(self) -> None:
        self.__dict__.pop("_occupied", None)
        self.errors = torch.zeros(self.bins, dtype=torch.float64)
        self.correct = torch.zeros(self.bins, dtype=torch.float64)

    def __getstate__(self) -> dict:
        """Pickled as each histogram's occupied bins and their counts (a worker's case fills few of the bins), and
        left so on arrival: :meth:`merge` adds them in place (``index_add_``), where dense copies were made and
        added whole (two 512 kB histograms per map and case, about 1 ms of the main process's CPU for a
        hippocampus case's four maps)."""
        def occupied(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            index = torch.from_numpy(np.flatnonzero(t.numpy() != 0))  # numpy's: 5x torch's nonzero on CPU
            return index, t[index]
        return {"bins": self.bins, "occupied": {name: occupied(getattr(self, name)) for name in self.HISTOGRAMS}}

    def __setstate__(self, state: dict) -> None:
        self.bins, self._occupied = state["bins"], dict(state["occupied"])

    def __getattr__(self, name: str) -> torch.Tensor:
        """``errors`` or ``correct`` of a histogram that arrived as its occupied bins: dense from its first use."""
        occupied = self.__dict__.get("_occupied", {})
        if name not in occupied:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        index, counts = occupied.pop(name)
        dense = torch.zeros(self.bins, dtype=torch.float64)
        dense[index] = counts
        setattr(self, name, dense)
        return dense

    def update(self, uncertainty: torch.Tensor, errors: torch.Tensor) -> None:
        u = uncertainty.reshape(-1).float().clamp(0.0, 1.0)
        index = torch.clamp((u * self.bins).long(), max=self.bins - 1).cpu()
        e = errors.reshape(-1).bool().cpu()
        self.errors += torch.bincount(index[e], minlength=self.bins).double()
        self.correct += torch.bincount(index[~e], minlength=self.bins).double()

    def merge(self, other: PooledAUROC) -> None:
        """Add the histograms of ``other`` (voxels of other cases, the same bins)."""
        if other.bins != self.bins:
            raise ValueError(f"merge: {other.bins} bins into {self.bins}")
        arrived = other.__dict__.get("_occupied", {})
        for name in self.HISTOGRAMS:  # counts: integers in float64, the same bits in any order
            if name in arrived:
                getattr(self, name).index_add_(0, *arrived[name])
            else:
                getattr(self, name).add_(getattr(other, name))

    def aggregate(self) -> float:
        n_pos, n_neg = self.errors.sum().item(), self.correct.sum().item()
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        below = torch.cumsum(self.correct, 0) - self.correct  # correct voxels in lower bins
        pairs = (self.errors * (below + 0.5 * self.correct)).sum().item()
        return pairs / (n_pos * n_neg)

    def max_error(self) -> float:
        """The largest difference to the exact AUROC of the same voxels: each (error, correct) pair of one bin
        is counted 1/2 where the exact AUROC counts 0, 1/2 or 1, so :math:`\\sum_b e_b c_b / (2 n_+ n_-)`
        (:math:`e_b, c_b` the bin's error and correct voxels); NaN where the AUROC is."""
        n_pos, n_neg = self.errors.sum().item(), self.correct.sum().item()
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        return (self.errors * self.correct).sum().item() / (2 * n_pos * n_neg)


def ue_dice(uncertainty: torch.Tensor, errors: torch.Tensor,
            thresholds: Sequence[float] = UEO_THRESHOLDS) -> torch.Tensor:
    """UE-Dice of one case at each threshold (``len(thresholds)`` values); ``uncertainty`` in [0, 1]."""
    u = uncertainty.reshape(-1).float()
    e = errors.reshape(-1).bool()
    t = torch.as_tensor(list(thresholds), dtype=u.dtype, device=u.device)
    above = u[None, :] > t[:, None]  # T x N
    both = (above & e[None, :]).sum(1).double()
    size = above.sum(1).double() + e.sum().double()
    return torch.where(size > 0, 2 * both / size.clamp_min(1), torch.ones_like(size))


def ueo(per_case: Sequence[torch.Tensor], thresholds: Sequence[float] = UEO_THRESHOLDS) -> tuple[float, float]:
    """(UEO, its threshold): the maximum over thresholds of the mean over cases of :func:`ue_dice`."""
    mean = torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in per_case]).mean(0)
    best = int(torch.argmax(mean))
    return float(mean[best]), float(thresholds[best])


# -------------------------------------------------------------------------------------------- case level
def micro_foreground_dice(prediction: torch.Tensor, label: torch.Tensor, multilabel: bool = False) -> float:
    """The Dice of all foreground voxels together (Kahl et al., ICLR 2024, ValUES' risk):
    :math:`2 \\sum_c |P_c \\cap L_c| / \\sum_c (|P_c| + |L_c|)` over the foreground classes c (integer maps
    ``*S``, background 0) or over the regions (binary ``R x *S`` maps, ``multilabel``), so that a large class
    weighs more than a small one. NaN when neither map has foreground (torchmetrics' ``zero_division`` would
    give 0, i.e. risk 1; mcseg leaves the case out, as the macro Dice does)."""
    if multilabel:
        p, y = prediction.bool(), label.bool()
        both = (p & y).sum()
    else:
        p, y = prediction > 0, label > 0
        both = ((prediction == label) & y).sum()
    size = int(p.sum() + y.sum())
    return float("nan") if size == 0 else 2 * int(both) / size


def aggregate_uncertainty(uncertainty: torch.Tensor, method: str, patch: int = 10,
                          threshold: float | None = None) -> float:
    """One case's score from its voxel uncertainty ``*S`` (module docstring): ``image`` (sum), ``patch``
    (largest window sum) or ``threshold`` (mean of the voxels >= ``threshold``, 0 when none is)."""
    u = uncertainty.float()
    if method == "image":
        return float(u.sum())
    if method == "patch":
        if patch < 1:
            raise ValueError(f"patch={patch}: expected a window of at least 1 voxel")
        if u.dim() not in (2, 3):
            raise ValueError(f"uncertainty of shape {tuple(u.shape)}: expected a 2D or 3D map")
        return float(window_sums(u.double(), patch).max())
    if method == "threshold":
        if threshold is None:
            raise ValueError("aggregate_uncertainty(method='threshold') needs the threshold taken from validation")
        kept = u[u >= threshold]
        return float(kept.mean()) if kept.numel() else 0.0
    raise ValueError(f"method={method!r}: expected image, patch or threshold")


def window_sums(u: torch.Tensor, size: int) -> torch.Tensor:
    """Sums over every ``size``-voxel window (cut to the map where it is smaller) that lies inside ``u``:
    a box filter, separable, from cumulative sums along each axis, O(voxels) whatever the window (a
    10^3 pooling kernel would cost 1000 operations a voxel on a CT volume)."""
    for axis in range(u.dim()):
        k = min(size, u.shape[axis])
        c = torch.cumsum(u, axis)
        zero = torch.zeros_like(c.narrow(axis, 0, 1))
        c = torch.cat([zero, c], axis)
        u = c.narrow(axis, k, c.shape[axis] - k) - c.narrow(axis, 0, c.shape[axis] - k)
    return u


def validation_threshold(maps: Sequence[torch.Tensor], foreground_fractions: Sequence[float]) -> float:
    """ValUES' threshold for ``threshold`` aggregation: the quantile ``q`` of every validation voxel's
    uncertainty, ``q`` the mean over validation cases of their predicted background fraction, so that the
    threshold keeps about as many voxels as the predictions hold foreground."""
    if not maps:
        raise ValueError("validation_threshold: no validation case")
    q = float(np.mean([1.0 - f for f in foreground_fractions]))
    values = torch.cat([m.reshape(-1).float() for m in maps]).numpy()
    return float(np.quantile(values, q))


class FailureDetection:
    """The failure-detection figures of an evaluation, accumulated case by case (module docstring).

    :meth:`add_case` takes the case's uncertainty maps (normalised to [0, 1], on the label's grid), its error
    voxels, the mask of its voxel region (``region``, named in the summary; None: every voxel) and its risk
    (``risk``, one of :data:`RISKS`, named in the summary; NaN: left out of the case-level figures and
    counted). :meth:`summary` gives, per map: the mean over cases of the per-case voxel AUROC
    (cases without both errors and correct voxels left out), the pooled AUROC, UEO with its threshold, and
    per case aggregation (``image``, ``patch``) AURC, E-AURC, AUGRC, fd-shifts' achievable AURC and E-AUGRC,
    and bootstrap intervals of AURC and AUGRC (``bootstrap_samples`` resamples of the cases, ``seed``), with
    confidence = minus the aggregated uncertainty.
    """

    AGGREGATIONS = ("image", "patch")

    def __init__(self, maps: Sequence[str], patch: int = 10, bins: int = 1 << 16, region: str = "union_foreground",
                 risk: str = "macro", bootstrap_samples: int = 1000, seed: int = 0) -> None:
        if risk not in RISKS:
            raise ValueError(f"risk={risk!r}: expected one of {', '.join(RISKS)}")
        self.maps, self.patch, self.region, self.risk = list(maps), patch, region, risk
        self.bootstrap_samples, self.seed = bootstrap_samples, seed
        self.pooled = {name: PooledAUROC(bins) for name in self.maps}
        self.auroc: dict[str, list[float]] = {name: [] for name in self.maps}
        self.ue: dict[str, list[torch.Tensor]] = {name: [] for name in self.maps}
        self.scores: dict[str, dict[str, list[float]]] = {m: {a: [] for a in self.AGGREGATIONS} for m in self.maps}
        self.risks: list[float] = []
        self.case_ids: list[str] = []
        self.rows: list[dict] = []  # per case: risk, voxel AUROC and aggregated uncertainty of each map

    def add_case(self, case_id: str, maps: dict[str, torch.Tensor], errors: torch.Tensor,
                 region: torch.Tensor | None, risk: float) -> dict:
        inside = (lambda t: t[region]) if region is not None else (lambda t: t.reshape(-1))
        e = inside(errors.bool())
        row = {"case": case_id, "risk": risk, "risk_definition": self.risk, "voxel_region": self.region}
        for name in self.maps:
            u = maps[name].float()
            voxels = inside(u)
            row[f"auroc/{name}"] = value = auroc(voxels, e)
            self.auroc[name].append(value)
            self.pooled[name].update(voxels, e)
            self.ue[name].append(ue_dice(voxels, e))
            for method in self.AGGREGATIONS:  # over the whole image: ValUES' case scores
                score = aggregate_uncertainty(u, method, self.patch)
                self.scores[name][method].append(score)
                row[f"{method}_uncertainty/{name}"] = score
        self.risks.append(float(risk))
        self.case_ids.append(case_id)
        self.rows.append(row)
        return row

    def merge(self, other: FailureDetection) -> None:
        """Add the cases of ``other`` (the same maps and settings, e.g. a worker's holding one case) after those
        added here: merged case by case in order, the summary is that of :meth:`add_case` on each."""
        if (other.maps, other.patch, other.region, other.risk) != (self.maps, self.patch, self.region, self.risk):
            raise ValueError("merge: the failure detections differ in maps, patch, region or risk")
        for name in self.maps:
            self.pooled[name].merge(other.pooled[name])
            self.auroc[name] += other.auroc[name]
            self.ue[name] += other.ue[name]
            for method in self.AGGREGATIONS:
                self.scores[name][method] += other.scores[name][method]
        self.risks += other.risks
        self.case_ids += other.case_ids
        self.rows += other.rows

    def summary(self) -> dict:
        risks = np.asarray(self.risks, dtype=np.float64)
        defined = np.isfinite(risks)
        out = {"protocol": {
            "voxel_region": self.region,
            "error_voxels": f"arg-max of the pooled prediction differs from the label, among the voxels of region "
                            f"{self.region} (voxel AUROC and UEO; Jungo & Reyes: all)",
            "voxel_auroc": "AUROC of the map for the error voxels, ties counted half; per case then averaged "
                           "(cases with both kinds of voxels), and pooled over 65536 equal-width bins",
            "ueo": "max over thresholds 0.05..0.95 (11) of the dataset-mean UE-Dice, U_t = {u > t} (Jungo & Reyes)",
            "risk_definition": self.risk, "risk": RISKS[self.risk],
            "confidence": "minus the case's aggregated uncertainty",
            "aggregations": {"image": "sum over the image", "patch": f"largest sum over {self.patch}-voxel windows"},
            "rc_curve": "fd-shifts: ties grouped, trapezoid, unscaled (fd-shifts shows x 1000); achievable AURC: "
                        "its dominant points joined by the curve on which errors and kept cases vary linearly",
            "rc_ci95": f"95% percentile bootstrap of AURC and AUGRC over cases, {self.bootstrap_samples} resamples, "
                       f"seed {self.seed} (numpy RandomState, fd-shifts' draws)",
            "maps": "normalised to [0, 1]: entropies / ln C, 1 - max p / (1 - 1/C)",
            "cases_without_risk": int((~defined).sum())}}
        for name in self.maps:
            values = [v for v in self.auroc[name] if not np.isnan(v)]
            ueo_value, threshold = ueo(self.ue[name]) if self.ue[name] else (float("nan"), None)
            entry = {"voxel_region": self.region, "voxel_auroc": float(np.mean(values)) if values else float("nan"),
                     "voxel_auroc_cases": len(values), "voxel_auroc_pooled": self.pooled[name].aggregate(),
                     "voxel_auroc_pooled_max_error": self.pooled[name].max_error(),
                     "ueo": ueo_value, "ueo_threshold": threshold}
            for method in self.AGGREGATIONS:
                conf = -np.asarray(self.scores[name][method])[defined]
                if conf.size:
                    r = risks[defined]
                    intervals = area_cis(conf, r, self.bootstrap_samples, self.seed)  # both from one resampling
                    entry[method] = {"aurc": aurc(conf, r), "eaurc": eaurc(conf, r), "augrc": augrc(conf, r),
                                     "aurc_achievable": achievable_aurc(conf, r), "eaugrc": eaugrc(conf, r),
                                     **{f"{area}_ci95": list(intervals[area]) for area in ("aurc", "augrc")}}
            out[name] = entry
        return out

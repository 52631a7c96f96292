"""Histogram binning and isotonic regression, classwise one-versus-rest with renormalisation: the classic
non-parametric post-hoc calibrators that segmentation papers compare against (Zadrozny & Elkan, KDD 2001 and
2002; netcal 1.4 and torch-uncertainty implement them this way; ../shared/reference/posthoc_and_conformal.md, A8).

For probabilities p (N voxels x C classes) and labels y, each class c gets a monotone map h_c fitted on the
pairs (p_c, 1[y = c]) of the fit voxels, and a voxel's calibrated probabilities are

    q_c = h_c(p_c) / sum_k h_k(p_k).

* :class:`HistogramBinning`: h_c is constant on M equal-width bins (lo, hi] (0 in the first bin: mcseg's ECE bins,
  :func:`mcseg.metrics.binning.bin_index`), the fraction of class-c voxels among the fit voxels in the bin; an empty
  bin keeps its centre.
* :class:`IsotonicCalibration`: h_c is scikit-learn's ``IsotonicRegression(y_min=0, y_max=1, increasing=True,
  out_of_bounds="clip")`` fitted on the same pairs (the pool-adjacent-violators fit of Zadrozny & Elkan 2002).

Policies (stated, as the references differ): a class absent from the fit labels maps to 0 (netcal and
torch-uncertainty alike); a voxel whose maps are all 0 gets the uniform 1/C (netcal returns NaN there). Neither
calibrator keeps the arg-max in general: :meth:`argmax_changes` counts the voxels whose class changes.

``mode="top_label"`` (Gupta & Ramdas, "Top-label calibration and multiclass-to-binary reductions", ICLR 2022; no
library reference checked, ../shared/reference A8 marks it UNVERIFIED): h_c is fitted on the voxels whose arg-max
(first maximum) is c only, on the pairs (p_c, 1[y = c]); a voxel predicted as c gets q_c = h_c(p_c) and the other
classes share 1 - q_c in proportion to their p_k (equally if those are all 0). The top-label confidence is then
calibrated per predicted class; the arg-max is still not kept: q_c can fall below another class's share (surely
when q_c < 1/C). A class that no fit voxel predicts keeps its confidence (identity map).

Fitted maps are plain numbers (:meth:`state`, :meth:`from_state`): bin values, or the isotonic fit's thresholds,
between which it is linear and beyond which it is clipped (scikit-learn's own prediction rule, applied with
``np.interp`` so that a map read back from JSON gives the same values as the fitted one).
"""
from __future__ import annotations

import numpy as np
import torch

from mcseg.metrics.binning import bin_index

__all__ = ["HistogramBinning", "IsotonicCalibration", "MODES"]


def _checked(probs: np.ndarray, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"probabilities of shape {p.shape}: expected N voxels x C >= 2 classes")
    if not np.isfinite(p).all() or p.min() < 0 or p.max() > 1:
        raise ValueError("probabilities must be finite and in [0, 1]")
    if labels is None:
        return p, None
    y = np.asarray(labels)
    if y.shape != (p.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels of shape {y.shape} and type {y.dtype}: expected {p.shape[0]} integers")
    if y.size and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ValueError(f"labels must lie in [0, {p.shape[1]}), found [{y.min()}, {y.max()}]")
    return p, y


MODES = ("classwise", "top_label")


class _OneVersusRest:
    """The shared part: fit one map per class (classwise or top-label), apply, renormalise."""

    kind: str

    def __init__(self, mode: str = "classwise") -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
        self.mode = mode

    def fit(self, probs, labels) -> _OneVersusRest:
        p, y = _checked(probs, labels)
        if p.shape[0] == 0:
            raise ValueError("no voxel to fit on")
        self.n_classes = p.shape[1]
        top = p.argmax(axis=1)
        self.maps = []
        for c in range(self.n_classes):
            pick = top == c if self.mode == "top_label" else np.ones(len(p), bool)
            hits = (y[pick] == c).astype(np.float64)
            present = bool(pick.any()) if self.mode == "top_label" else bool(hits.any())
            self.maps.append(self._fit_one(p[pick, c], hits) if present else None)
        return self

    def map(self, c: int, values: np.ndarray) -> np.ndarray:
        """h_c of ``values`` (class c's fitted map; the fallback of the module docstring where it has none)."""
        if self.maps[c] is None:
            return np.zeros_like(values) if self.mode == "classwise" else values
        return self._map_one(self.maps[c], values)

    def transform(self, probs) -> np.ndarray:
        p, _ = _checked(probs)
        if p.shape[1] != getattr(self, "n_classes", None):
            raise ValueError(f"probabilities with {p.shape[1]} classes, the calibrator was fitted on "
                             f"{getattr(self, 'n_classes', 'none (not fitted)')}")
        if self.mode == "top_label":
            return self._top_label(p)
        mapped = np.stack([self.map(c, p[:, c]) for c in range(self.n_classes)], axis=1)
        total = mapped.sum(axis=1, keepdims=True)
        return np.where(total > 0, mapped / np.where(total > 0, total, 1.0), 1.0 / self.n_classes)

    def _top_label(self, p: np.ndarray) -> np.ndarray:
        rows, top = np.arange(len(p)), p.argmax(axis=1)
        confidence = p[rows, top]
        calibrated = confidence.copy()
        for c in range(self.n_classes):
            chosen = top == c
            calibrated[chosen] = self.map(c, confidence[chosen])
        others = p.copy()
        others[rows, top] = 0.0
        rest = others.sum(axis=1)
        share = np.where(rest[:, None] > 0, others / np.where(rest > 0, rest, 1.0)[:, None], 1.0 / (self.n_classes - 1))
        out = share * (1.0 - calibrated)[:, None]
        out[rows, top] = calibrated
        return out

    def argmax_changes(self, probs) -> int:
        """How many voxels change their arg-max (first maximum) when calibrated."""
        p, _ = _checked(probs)
        return int((self.transform(p).argmax(axis=1) != p.argmax(axis=1)).sum())

    def n_parameters(self) -> int:
        """How many values its fitted maps hold: a bin value per bin (histogram), a threshold pair per knot
        (isotonic); classes without a map hold none."""
        return sum(self._size_one(m) for m in self.maps if m is not None)

    def state(self) -> dict:
        """The fitted maps as JSON-able numbers (None for a class without a map)."""
        if not hasattr(self, "maps"):
            raise ValueError(f"{self.kind}: not fitted")
        return {"kind": self.kind, "mode": self.mode, "n_classes": self.n_classes, **self._settings(),
                "maps": [None if m is None else self._state_one(m) for m in self.maps]}

    @classmethod
    def from_state(cls, state: dict) -> _OneVersusRest:
        """The calibrator :meth:`state` describes; an error names what is missing or malformed."""
        try:
            if state["kind"] != cls.kind:
                raise ValueError(f"a {state['kind']!r} state, not {cls.kind!r}")
            calibrator = cls(mode=state["mode"], **{k: state[k] for k in cls._setting_keys})
            calibrator.n_classes = int(state["n_classes"])
            calibrator.maps = [None if m is None else calibrator._read_one(m) for m in state["maps"]]
            if len(calibrator.maps) != calibrator.n_classes:
                raise ValueError(f"{len(calibrator.maps)} maps for {calibrator.n_classes} classes")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{cls.kind} calibrator record: {exc!r}") from None
        return calibrator

    _setting_keys: tuple[str, ...] = ()

    def _settings(self) -> dict:
        return {k: getattr(self, k) for k in self._setting_keys}


class HistogramBinning(_OneVersusRest):
    """Histogram binning (module docstring) with ``n_bins`` equal-width bins."""

    kind = "histogram"
    _setting_keys = ("n_bins",)

    def __init__(self, n_bins: int = 15, mode: str = "classwise") -> None:
        if not isinstance(n_bins, int) or isinstance(n_bins, bool) or n_bins < 1:
            raise ValueError(f"n_bins={n_bins!r}: expected an integer >= 1")
        super().__init__(mode)
        self.n_bins = n_bins

    def _bins(self, values: np.ndarray) -> np.ndarray:
        return bin_index(torch.from_numpy(np.asarray(values, dtype=np.float64)), self.n_bins).numpy()

    def _fit_one(self, values: np.ndarray, hits: np.ndarray) -> np.ndarray:
        centres = (np.arange(self.n_bins) + 0.5) / self.n_bins
        b = self._bins(values)
        count = np.bincount(b, minlength=self.n_bins)
        hit = np.bincount(b, weights=hits, minlength=self.n_bins)
        return np.where(count > 0, hit / np.maximum(count, 1), centres)

    def _map_one(self, values_of_bins: np.ndarray, values: np.ndarray) -> np.ndarray:
        return values_of_bins[self._bins(values)]

    @property
    def values(self) -> list[np.ndarray | None]:
        """Each class's bin values (None: no map)."""
        return self.maps

    def _state_one(self, m: np.ndarray) -> list[float]:
        return m.tolist()

    @staticmethod
    def _size_one(m: np.ndarray) -> int:
        return len(m)

    def _read_one(self, m) -> np.ndarray:
        values = np.asarray(m, dtype=np.float64)
        if values.shape != (self.n_bins,):
            raise ValueError(f"{values.shape[0] if values.ndim == 1 else values.shape} bin values for {self.n_bins} bins")
        return values


class IsotonicCalibration(_OneVersusRest):
    """Isotonic regression (module docstring), fitted by scikit-learn's ``IsotonicRegression``."""

    kind = "isotonic"

    def _fit_one(self, values: np.ndarray, hits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from sklearn.isotonic import IsotonicRegression

        fitted = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(values, hits)
        return np.asarray(fitted.X_thresholds_, np.float64), np.asarray(fitted.y_thresholds_, np.float64)

    def _map_one(self, thresholds: tuple[np.ndarray, np.ndarray], values: np.ndarray) -> np.ndarray:
        return np.interp(values, *thresholds)

    def _state_one(self, m: tuple[np.ndarray, np.ndarray]) -> dict:
        return {"x": m[0].tolist(), "y": m[1].tolist()}

    @staticmethod
    def _size_one(m: tuple[np.ndarray, np.ndarray]) -> int:
        return len(m[0])  # the knots: each an (x, y) pair of the fitted step function

    def _read_one(self, m) -> tuple[np.ndarray, np.ndarray]:
        x, y = np.asarray(m["x"], np.float64), np.asarray(m["y"], np.float64)
        if x.ndim != 1 or x.shape != y.shape or len(x) == 0 or np.any(np.diff(x) < 0):
            raise ValueError("isotonic thresholds: expected equally long, non-empty, increasing x and y")
        return x, y

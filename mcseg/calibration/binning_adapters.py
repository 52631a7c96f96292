"""Histogram binning and isotonic regression as post-hoc scalers (:mod:`mcseg.calibration.scaler_interface`), on the
calibrators of :mod:`mcseg.calibration.binning`.

Four names: ``histogram`` and ``isotonic`` (classwise one-versus-rest, renormalised: the definition of netcal and
torch-uncertainty, ../shared/reference/posthoc_and_conformal.md A8) and ``histogram_top`` and ``isotonic_top``
(top-label: a map per predicted class on its confidence). ``posthoc.histogram_bins`` (default 15, mcseg's ECE
bins) sets the equal-width bins of histogram binning.

They are fitted on the probabilities (softmax) of the voxel sample of ``posthoc.voxels`` and map probabilities to
probabilities; :meth:`apply` returns their logarithm as the "logits" (softmax of them gives the calibrated
probabilities back), a probability of 0 kept at 1e-12 (:func:`~mcseg.calibration.logit_scaling.inverse_link`, log 1e-12 =
-27.6; the softmax then moves the others by at most 1e-12 x C, below float32's resolution), so every logit is
finite and the NLL of a voxel whose class was mapped to 0 is 27.6, not infinite. A case is calibrated
``CHUNK`` voxels at a time: the only full-size tensor made is the result.

None of them keeps the arg-max (top-label neither: a calibrated confidence below another class's share moves it),
so ``preserves_argmax`` is False: a segmentation scored after them is the arg-max of the calibrated probabilities,
and calibration.json counts the fit voxels whose arg-max changed. Softmax outputs only: multi-label (sigmoid
region) models are refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from mcseg.calibration.binning import HistogramBinning, IsotonicCalibration, _OneVersusRest
from mcseg.calibration.scaler_interface import FitData, FitOptions, Scaler
from mcseg.calibration.logit_scaling import nll
from mcseg.calibration.logit_scaling import inverse_link

__all__ = ["BINNING_SCALERS", "CHUNK", "HistogramScaler", "HistogramTopScaler", "IsotonicScaler",
           "IsotonicTopScaler"]

CHUNK = 1 << 20  # voxels calibrated at a time by apply


class _BinningScaler(Scaler):
    """A :class:`~mcseg.calibration.binning._OneVersusRest` calibrator behind the Scaler interface; its fitted
    maps are in the record (``calibrator``), with the fit's NLL before and after on the fit voxels."""

    preserves_argmax = False
    softmax_only = True  # read by PosthocConfig.check_outputs: refused on multi-label models before training
    mode: ClassVar[str]
    calibrator_type: ClassVar[type[_OneVersusRest]]

    def __init__(self, calibrator: _OneVersusRest | None = None, record: dict | None = None) -> None:
        self.calibrator, self.record = calibrator, record

    @classmethod
    def unfitted(cls, options: FitOptions) -> _OneVersusRest:
        raise NotImplementedError

    @classmethod
    def configured(cls, options: FitOptions) -> Scaler:
        return cls(cls.unfitted(options))

    def fit(self, data: FitData) -> dict:
        if data.voxels is None:
            raise ValueError(f"post-hoc scaler {self.name!r} is fitted on a voxel sample; none was given")
        if data.multilabel:
            raise ValueError(f"post-hoc scaler {self.name!r} calibrates the classes of a softmax; this model predicts "
                             f"independent (sigmoid) regions: remove it from posthoc.fit")
        logits, target = data.voxels
        probs = torch.softmax(logits.double(), 1)  # as apply computes them (a softmax model's link)
        self.calibrator.fit(probs.numpy(), target.long().numpy())
        calibrated = torch.from_numpy(self.calibrator.transform(probs.numpy()))
        self.record = {"nll_before": float(nll(probs, target, False)), "nll_after": float(nll(calibrated, target, False)),
                       **data.sample, "mode": self.mode, "calibrator": self.calibrator.state()}
        return self.record

    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        if self.calibrator is None or not hasattr(self.calibrator, "maps"):
            raise RuntimeError(f"post-hoc scaler {self.name!r} is not fitted")
        k = logits.shape[0]
        flat = logits.reshape(k, -1)
        out = torch.empty_like(flat)
        for lo in range(0, flat.shape[1], CHUNK):
            p = torch.softmax(flat[:, lo:lo + CHUNK].double(), 0).T.cpu().numpy()
            q = torch.from_numpy(self.calibrator.transform(p)).T
            out[:, lo:lo + CHUNK] = inverse_link(q, False).to(out.device, out.dtype)
        return out.reshape(logits.shape)

    def n_parameters(self) -> int | None:
        """The values of its fitted maps (:meth:`~mcseg.calibration.binning._OneVersusRest.n_parameters`)."""
        return self.calibrator.n_parameters() if self.calibrator is not None and hasattr(self.calibrator, "maps") \
            else None

    def save(self, directory: Path, key: str = "") -> dict:
        if self.record is None:
            raise RuntimeError(f"post-hoc scaler {self.name!r} is not fitted")
        return dict(self.record)

    @classmethod
    def load(cls, record: dict, directory: Path) -> Scaler:
        if "calibrator" not in record:
            raise ValueError(f"{directory}: the {cls.name!r} record of calibration.json has no 'calibrator'; refit "
                             f"post-hoc calibration (posthoc.refit=true)")
        calibrator = cls.calibrator_type.from_state(record["calibrator"])
        if calibrator.mode != cls.mode:
            raise ValueError(f"{directory}: the {cls.name!r} record of calibration.json holds a {calibrator.mode} "
                             f"calibrator, not {cls.mode}; refit post-hoc calibration (posthoc.refit=true)")
        return cls(calibrator, dict(record))

    def how(self) -> str:
        r = self.record or {}
        return ", ".join(str(v) for v in (r.get("voxels"), self.mode.replace("_", "-")) if v)


class HistogramScaler(_BinningScaler):
    """Classwise histogram binning (one-versus-rest, renormalised), ``posthoc.histogram_bins`` equal-width bins."""

    name, mode, calibrator_type = "histogram", "classwise", HistogramBinning

    @classmethod
    def unfitted(cls, options: FitOptions) -> _OneVersusRest:
        return HistogramBinning(options.histogram_bins, cls.mode)

    def how(self) -> str:
        bins = (self.record or {}).get("calibrator", {}).get("n_bins")
        return f"{super().how()}, {bins} bins" if bins else super().how()


class HistogramTopScaler(HistogramScaler):
    """Top-label histogram binning: a map per predicted class on its confidence."""

    name, mode = "histogram_top", "top_label"


class IsotonicScaler(_BinningScaler):
    """Classwise isotonic regression (one-versus-rest, renormalised), on scikit-learn's IsotonicRegression."""

    name, mode, calibrator_type = "isotonic", "classwise", IsotonicCalibration

    @classmethod
    def unfitted(cls, options: FitOptions) -> _OneVersusRest:
        return IsotonicCalibration(cls.mode)


class IsotonicTopScaler(IsotonicScaler):
    """Top-label isotonic regression: a map per predicted class on its confidence."""

    name, mode = "isotonic_top", "top_label"


BINNING_SCALERS = (HistogramScaler, HistogramTopScaler, IsotonicScaler, IsotonicTopScaler)

"""The figures of a multi-rater evaluation, per case and over cases (docs/protocol.md, "Several raters").

:class:`RaterFigures` is fed by :class:`~mcseg.evaluation.evaluator.Evaluator` with each case's probabilities,
prediction and raters' maps (on the file grid), and the label maps of a predictor's members when it has them;
the definitions are those of :mod:`mcseg.metrics.raters`, :mod:`mcseg.metrics.rater_calibration`,
:mod:`mcseg.metrics.volume` and :mod:`mcseg.metrics.samples`. Its summary is the ``raters`` key of
summary.json; its rows are per_case_raters.csv (case x class) and per_rater.csv (case x rater x class), and its
pooled top-label reliability bins against the rater mean and against each rater are reliability_raters.csv.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from mcseg.data.raters import staple_reference
from mcseg.metrics.binning import BinSums
from mcseg.metrics.rater_calibration import (
    SoftCalibration, curvas2024_crop, curvas2025_crop, curvas_ece, rater_reliability, soft_calibration,
)
from mcseg.metrics.raters import (
    binary_dice, consensus_dice, curvas_row_dice, per_rater_dice, per_rater_hd, thresholded_dice, thresholds_of,
)
from mcseg.metrics.reliability import TABLE_COLUMNS, reliability_table
from mcseg.metrics.samples import generalised_energy_distance, hungarian_matched_iou
from mcseg.metrics.statistics import describe, nanmean
from mcseg.metrics.volume import volume_crps

__all__ = ["RaterFigures", "CLASS_FIGURES", "CASE_FIGURES", "RATER_COLUMNS", "RELIABILITY_FILE",
           "RELIABILITY_COLUMNS", "MEAN_PANEL", "rater_panel"]

# per case and class
CLASS_FIGURES = ("dice_rater_mean", "hd95_rater_mean_mm", "consensus_dice", "curvas2024_row_dice", "staple_dice",
                 "thresholded_dice", "volume_crps", "volume_predicted", "volume_rater_mean", "volume_rater_std")
# per case, the mean over foreground classes (summary "foreground")
FOREGROUND_FIGURES = CLASS_FIGURES[:7]
# per case
CASE_FIGURES = ("n_raters", "ece_mean", "classwise_ece_mean", "nll_mean", "brier_mean", "ece_curvas_rater_mean",
                "ged", "hm_iou", "diversity", "n_samples")
RATER_COLUMNS = ("case", "rater", "class_name", "dice", "hd95_mm", "ece_curvas")
# reliability_raters.csv: reliability.csv's columns and the rater of each panel ("" for the rater mean)
RELIABILITY_FILE = "reliability_raters.csv"
RELIABILITY_COLUMNS = (TABLE_COLUMNS[0], "rater", *TABLE_COLUMNS[1:])
MEAN_PANEL = "rater mean"
VOLUME_CRPS = ("normal", "curvas_code")
CROPS = ("all", "curvas2024", "curvas2025")


def rater_panel(name: str) -> str:
    """The panel of reliability_raters.csv against rater ``name``."""
    return f"rater {name}"


class RaterFigures:
    """Accumulates the multi-rater figures of one evaluation (module docstring)."""

    def __init__(self, num_classes: int, class_names: Sequence[str], n_bins: int, hd_percentile: float,
                 hd_definition: str, thresholds: str | Sequence[float] = "qubiq", volume: str = "normal",
                 crop: str = "all") -> None:
        if volume not in VOLUME_CRPS:
            raise ValueError(f"evaluation.rater_volume_crps={volume!r}: expected one of {', '.join(VOLUME_CRPS)}")
        if crop not in CROPS:
            raise ValueError(f"evaluation.rater_crop={crop!r}: expected one of {', '.join(CROPS)}")
        self.num_classes, self.class_names = num_classes, list(class_names)
        self.n_bins, self.hd_percentile, self.hd_definition = n_bins, hd_percentile, hd_definition
        try:
            self.thresholds = thresholds_of(thresholds)
        except ValueError as exc:
            raise ValueError(f"evaluation.rater_{exc}") from None
        self.threshold_source = thresholds if isinstance(thresholds, str) else "list"
        self.volume, self.crop = volume, crop
        self.cases: list[dict] = []
        self.rater_rows: list[dict] = []
        self.pooled: SoftCalibration | None = None
        self.rater_bins: dict[str, BinSums] = {}  # rater name -> top-label bins against it, pooled over cases

    def add_case(self, case_id: str, probs: torch.Tensor, prediction: torch.Tensor, raters: torch.Tensor,
                 spacing: Sequence[float], rater_names: Sequence[str] | None = None,
                 samples: torch.Tensor | None = None, image: torch.Tensor | None = None) -> dict:
        """Score one case: ``probs`` ``C x *S``, ``prediction`` ``*S``, ``raters`` ``K x *S`` (all on one grid),
        ``samples`` ``N x *S`` member label maps or None, ``image`` the raw ``*S`` CT (HU) for
        ``crop="curvas2024"``. Returns the case's figures."""
        c, k = self.num_classes, raters.shape[0]
        names = list(rater_names) if rater_names else [str(r + 1) for r in range(k)]
        raters = raters.to(device=probs.device, dtype=torch.long)
        dice = per_rater_dice(prediction, raters, c)  # K x C
        hd = per_rater_hd(prediction, raters, c, spacing, self.hd_percentile, self.hd_definition)
        staple = torch.as_tensor(staple_reference(raters, c), device=prediction.device)
        staple_dice = torch.tensor([math.nan] + [binary_dice(prediction == j, staple == j) for j in range(1, c)])
        box = self._crop(case_id, raters, image)  # the voxels of the CURVAS figures
        cropped = (slice(None), *box) if box is not None else (slice(None),)
        volume = volume_crps(probs[cropped], raters[cropped], float(np.prod(spacing)) / 1000.0,
                             self.volume == "curvas_code")
        soft = soft_calibration(probs, raters, self.n_bins)
        by_rater = rater_reliability(probs, raters, self.n_bins)
        ece = curvas_ece(probs, raters, 2025 if c == 2 else 2024, crop=box)  # binary: 2025's [1 - p, p]
        per_class = {
            "dice_rater_mean": _nanmean_rows(dice), "hd95_rater_mean_mm": _nanmean_rows(hd),
            "consensus_dice": consensus_dice(prediction, raters, c).tolist(),
            "curvas2024_row_dice": (curvas_row_dice(prediction, raters, c).tolist() if prediction.ndim == 3
                                    else [math.nan] * c),
            "staple_dice": staple_dice.tolist(),
            "thresholded_dice": thresholded_dice(probs, raters, c, self.thresholds).tolist(),
            **volume,
        }
        case = {"case": case_id, **per_class, "n_raters": k, **soft.values(),
                "ece_curvas_rater_mean": ece["ece_rater_mean"],
                "ged": math.nan, "hm_iou": math.nan, "diversity": math.nan, "n_samples": 0}
        case.pop("n_voxels")
        if samples is not None and samples.shape[0] > 0:
            samples = samples.to(device=raters.device, dtype=torch.long)
            ged = generalised_energy_distance(samples, raters, c)
            case.update(ged=ged["ged"], diversity=ged["diversity"], n_samples=ged["n_samples"],
                        hm_iou=hungarian_matched_iou(samples, raters, c))
        # commit only a fully scored case
        self.pooled = soft if self.pooled is None else self.pooled + soft
        self.cases.append(case)
        for r, name in enumerate(names):
            prior = self.rater_bins.get(name)
            self.rater_bins[name] = by_rater[r] if prior is None else prior + by_rater[r]
            for j in range(1, c):
                self.rater_rows.append({"case": case_id, "rater": name, "class_name": self.class_names[j],
                                        "dice": float(dice[r, j]), "hd95_mm": float(hd[r, j]),
                                        "ece_curvas": ece["ece_per_rater"][r]})
        return case

    def _crop(self, case_id: str, raters: torch.Tensor, image: torch.Tensor | None) -> tuple[slice, ...] | None:
        if self.crop == "curvas2025":
            return curvas2025_crop(raters)
        if self.crop == "curvas2024":
            if image is None:
                raise ValueError("evaluation.rater_crop=curvas2024 needs the case's CT in HU (its in-plane box of "
                                 "voxels > 0)")
            if tuple(image.shape) != tuple(raters.shape[1:]):
                raise ValueError(f"the CT of shape {tuple(image.shape)} is not on the raters' grid "
                                 f"{tuple(raters.shape[1:])}")
            return curvas2024_crop(torch.as_tensor(image), slice_axis=-1)
        return None

    def rows(self) -> list[dict]:
        """per_case_raters.csv: one row per case and foreground class."""
        out = []
        for case in self.cases:
            shared = {key: case[key] for key in CASE_FIGURES}
            for j in range(1, self.num_classes):
                out.append({"case": case["case"], "class_name": self.class_names[j],
                            **{key: case[key][j] for key in CLASS_FIGURES}, **shared})
        return out

    def reliability_rows(self) -> list[dict]:
        """reliability_raters.csv: the top-label bins pooled over cases against the rater mean (panel
        ``MEAN_PANEL``, the bins of the pooled ``ece_mean``), then against each rater in the order first seen
        (panel :func:`rater_panel`, over the cases that rater labelled); ``accuracy`` is the observed frequency,
        mean m_yhat or mean 1[y_k = yhat] per bin."""
        if self.pooled is None:
            return []
        names = list(self.rater_bins)
        panels = [MEAN_PANEL, *(rater_panel(n) for n in names)]
        sums = BinSums.stack([self.pooled.top, *self.rater_bins.values()]).to("cpu")
        rater_of = dict(zip(panels, ["", *names]))
        return [{**row, "rater": rater_of[row["panel"]]} for row in reliability_table(sums, panels)]

    def summary(self, n_boot: int, seed: int) -> dict:
        cases = self.cases
        per_class = {self.class_names[j]: {key: describe([c[key][j] for c in cases], n_boot, seed)
                                           for key in CLASS_FIGURES}
                     for j in range(1, self.num_classes)}
        foreground = {key: describe([nanmean(c[key][1:]) for c in cases], n_boot, seed) for key in FOREGROUND_FIGURES}
        case_level = {key: describe([c[key] for c in cases], n_boot, seed) for key in CASE_FIGURES
                      if key not in ("n_raters", "n_samples")}
        by_rater: dict[str, dict[str, list[float]]] = {}
        for row in self.rater_rows:
            entry = by_rater.setdefault(row["rater"], {"dice": [], "hd95_mm": [], "ece_curvas": {}})
            entry["dice"].append(row["dice"])
            entry["hd95_mm"].append(row["hd95_mm"])
            entry["ece_curvas"][row["case"]] = row["ece_curvas"]
        per_rater = {name: {"mean_foreground_dice": nanmean(v["dice"]), "mean_foreground_hd95_mm": nanmean(v["hd95_mm"]),
                            "ece_curvas": nanmean(list(v["ece_curvas"].values())), "n_cases": len(v["ece_curvas"])}
                     for name, v in by_rater.items()}
        raters = [c["n_raters"] for c in cases]
        samples = sorted({c["n_samples"] for c in cases})
        return {
            "n_cases": len(cases),
            "raters_per_case": {"min": min(raters), "max": max(raters)} if raters else None,
            "n_samples": samples,
            "foreground": foreground,
            "per_class": per_class,
            "case": case_level,
            "per_rater": per_rater,
            "pooled": self.pooled.values() if self.pooled is not None else None,
            "protocol": self.protocol(),
        }

    def protocol(self) -> dict:
        return {
            "references": "the raters' label maps of each case, on the file grid; m_c = fraction of raters giving c",
            "dice_rater_mean": "mean over raters of the Dice against each rater (per rater: per_rater.csv)",
            "hd95_rater_mean_mm": f"mean over raters of HD{self.hd_percentile:g} (mm) against each rater",
            "consensus_dice": "3D Dice per class of (prediction = c outside the dissensus) against 'every rater "
                              "gave c' (CURVAS 2024 as described)",
            "curvas2024_row_dice": "the same regions as the CURVAS 2024 code scores them: MONAI DiceMetric on 3D "
                                   "arrays without batch/channel axes = two-stage mean of 1D Dices along x over rows "
                                   "y >= 1 and slices z, empty-reference rows skipped (3D cases only)",
            "staple_dice": "Dice against SimpleITK STAPLE (2 classes: probability > 0.5) or MultiLabelSTAPLE "
                           "(undecided: majority vote)",
            "thresholded_dice": f"QUBIQ: mean over t of Dice(p_c > t, m_c > t), both empty = 1; thresholds "
                                f"{list(self.thresholds)} ({self.threshold_source})",
            "ece_mean": f"top-label ECE against the rater mean (observed = m of the predicted class), "
                        f"{self.n_bins} bins (lo, hi], every voxel",
            "classwise_ece_mean": "(1/C) sum_c ECE of p_c against m_c, background included",
            "reliability": f"{RELIABILITY_FILE}: top-label bins pooled over cases, every voxel, {self.n_bins} bins "
                           "(lo, hi] over r = max_c p_c; panel 'rater mean': observed = m of the predicted class "
                           "(the bins of the pooled ece_mean); panel 'rater <name>': observed = 1[that rater gave "
                           "the predicted class], over the cases it labelled (its single-label bins)",
            "nll_mean": "-(1/N) sum_v sum_c m_c log p_c (= mean of the raters' NLL)",
            "brier_mean": "(1/N) sum_v sum_c (p_c - m_c)^2 (not the mean of the raters' Brier)",
            "ece_curvas": "CURVAS: one top-label ECE per rater against its labels, torchmetrics binning, 50 bins "
                          f"[lo, hi) + a bin at 1.0, P rebuilt from the foreground channels; voxels: {self.crop}",
            "volume_crps": ("CRPS (mL) of the expected volume against Normal(mean, population std) of the raters' "
                            "volumes, " + ("closed form over the whole line" if self.volume == "normal" else
                                           "as the CURVAS code: interpolated CDF, integral truncated to mu +- 3 sigma")
                            + f"; voxels: {self.crop}"),
            "crop": {"all": "every voxel", "curvas2024": "CURVAS 2024: the in-plane box of CT > 0 HU, every slice",
                     "curvas2025": "CURVAS 2025: the box of every rater's foreground +- 20 voxels, Python slicing "
                                   "(a negative start wraps)"}[self.crop],
            "ged": "generalised energy distance D^2 of the members' label maps against the raters, d = 1 - mean "
                   "foreground IoU, IoU(empty, empty) = 1",
            "hm_iou": "Hungarian-matched IoU, raters and members replicated to lcm(N, M)",
            "aggregation": "per class: over cases, NaN excluded; foreground: per-case mean over foreground classes",
        }


def _nanmean_rows(values: torch.Tensor) -> list[float]:
    """Mean over raters (rows) per class, NaN raters skipped (NaN when every rater's value is)."""
    defined = ~values.isnan()
    mean = values.nan_to_num(0.0).sum(0) / defined.sum(0).clamp_min(1)
    return torch.where(defined.any(0), mean, torch.nan).tolist()

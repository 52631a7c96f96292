"""What a conformal fit writes, shared by ``mcseg-conformal-folder`` and a checkpoint's evaluation: conformal.json
(the settings and the guarantee they give, per class the threshold and margins, the test figures of the cases they
were applied to; JSON has no inf or NaN: such values are null, and the record says what null means) and each
case's masks (:func:`write_masks`)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mcseg.conformal.fit import CaseSummary, ConformalSettings
from mcseg.conformal.risks import ABSENT_POLICIES, LOSSES

__all__ = ["CONFORMAL_FILE", "GUARANTEE", "KINDS", "NOT_COMPUTED", "class_records", "finite", "fit_lines",
           "settings_record", "shown", "test_figures", "versions", "write_masks"]

CONFORMAL_FILE = "conformal.json"  # the record of one fit: mcseg-conformal-folder's and an evaluation's

KINDS = ("set", "possible", "sure")  # the masks written per case and class
NOT_COMPUTED = "not computed"  # how a null figure of conformal.json is said to people

GUARANTEE = ("per case, for a new case exchangeable with the calibration cases (cases, never voxels, are the "
             "units): CRC: E[loss of the class's set] <= alpha; RCPS and LTT: P(expected loss <= alpha) >= 1 - delta "
             "over the calibration draw; margins: P(the grown mask covers >= tau of the class) >= 1 - alpha, and "
             "separately P(the shrunk mask lies inside it) >= 1 - alpha. Under absent='skip' the threshold's and "
             "the margins' guarantees hold for cases that contain the class")
BOUNDS = {"crc": "(n/(n+1)) R_n(t) + B/(n+1) <= alpha, B = 1; the largest such grid threshold",
          "rcps": "MAPIE's upper confidence bound < alpha; the last grid threshold before the first that is not",
          "ltt": "the Hoeffding-Bentkus p-value of the threshold"}


def finite(value: float) -> float | None:
    """JSON has no inf or NaN: null."""
    return float(value) if math.isfinite(value) else None


def versions() -> dict:
    from importlib.metadata import version

    return {"mcseg": version("mcseg"), "mapie": version("mapie")}


def settings_record(settings: ConformalSettings, summaries: CaseSummary) -> dict:
    """The settings, the guarantee, the policies and the threshold grid."""
    return {
        "guarantee": GUARANTEE, "alpha": settings.alpha, "delta": settings.delta,
        "method": settings.method, "loss": settings.loss, "loss_text": LOSSES[settings.loss].text,
        **({"rcps_bound": settings.rcps_bound} if settings.method == "rcps" else {}),
        **({"fwer": settings.fwer} if settings.method == "ltt" else {}),
        "bound_compared": BOUNDS[settings.method],
        "absent": {"policy": settings.absent, "text": ABSENT_POLICIES[settings.absent]},
        "grid": {"size": int(len(summaries.thresholds)), "first": float(summaries.thresholds[0]),
                 "last": float(summaries.thresholds[-1])},
        "margins": {"distance": "Euclidean, mm, with each case's voxel spacing (scipy.ndimage.distance_transform_edt)",
                    "predicted_structure": "the tool's label map where it wrote one, else the arg-max (regions: "
                                           "p > 0.5)",
                    "outer": "possible = voxels within outer_mm of the predicted structure",
                    "inner": "sure = voxels of the predicted structure deeper than inner_mm (the volume border counts "
                             "as outside)",
                    "null": "no finite margin: alpha < 1/(n+1), or a calibration case with an empty prediction"},
    }


def class_records(settings: ConformalSettings, thresholds: dict, margins: dict, names: list[str]) -> dict:
    """Per class name: the threshold, its calibration risk and bound, n and the cases without the class, margins."""
    out = {}
    for k in settings.classes:
        t, m = thresholds[k], margins[k]
        out[names[k]] = {
            "channel": k, "threshold": t["threshold"], "calibration_risk": t["risk"], "bound": t["bound"],
            "controlled": t["controlled"], "n_cases": t["n_cases"], "cases_without_class": t["cases_without_class"],
            "margin": {"outer_mm": finite(m["outer_mm"]), "inner_mm": finite(m["inner_mm"]), "tau": m["tau"],
                       "n_cases": m["n_cases"]}}
    return out


def test_figures(rows: list[dict], settings: ConformalSettings) -> dict:
    """Per class over the test cases: mean loss (a loss that needs the class, e.g. the FNR: over the cases that contain
    it under the skip policy), the sets' and grown
    masks' volume relative to the prediction, the fraction covered and the fraction whose shrunk mask is inside."""
    out = {}
    for name in dict.fromkeys(r["class"] for r in rows):
        mine = [r for r in rows if r["class"] == name]
        present = [r for r in mine if r["present"]]
        scored = present if LOSSES[settings.loss].needs_class and settings.absent == "skip" else mine
        losses = np.array([0.0 if math.isnan(r["loss"]) else r["loss"] for r in scored], np.float64)

        def mean(key: str, among=present) -> float | None:
            values = np.array([r[key] for r in among], np.float64)
            values = values[np.isfinite(values)]
            return finite(values.mean()) if len(values) else None

        out[name] = {"n_cases": len(scored), "n_cases_with_class": len(present),
                     "mean_loss": finite(losses.mean()) if len(losses) else None,
                     "loss_above_alpha": int((losses > settings.alpha).sum()),
                     "mean_set_over_prediction": mean("set_over_prediction"),
                     "mean_possible_over_prediction": mean("possible_over_prediction"),
                     "covered": mean("covered"), "sure_inside": mean("sure_inside")}
    return out


def shown(value: float | None, digits: str = ".4g", unit: str = "") -> str:
    """A figure of conformal.json for people: ``not computed`` where it is null (a margin without a finite quantile,
    a test figure without a case holding the class), never Python's ``None``."""
    return NOT_COMPUTED if value is None else f"{format(value, digits)}{unit}"


def fit_lines(record: dict) -> list[str]:
    """One line per class of a conformal.json record (the folder command's and an evaluation's): the threshold
    and its calibration risk, whether it is controlled, the margins and, where applied, the test figures."""
    lines = []
    for name, fit in record["classes"].items():
        margin, test = fit["margin"], (record.get("test") or {}).get(name)
        lines.append(
            f"{name}: t = {shown(fit['threshold'])} ({record['method']}, {record['loss']} <= {record['alpha']}; "
            f"calibration risk {shown(fit['calibration_risk'])}, n = {fit['n_cases']}"
            f"{'' if fit['controlled'] else ', NOT controlled: the most conservative threshold'}); margins "
            f"{shown(margin['outer_mm'], '.3g', ' mm')} out, {shown(margin['inner_mm'], '.3g', ' mm')} in"
            + (f"; test {record['loss']} {shown(test['mean_loss'])}, covered {shown(test['covered'], '.3g')}"
               if test else ""))
    return lines


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def write_masks(folder: Path, case: str, sets: dict, names: list[str], affine, source: Path | None = None) -> list[str]:
    """``<case>_<set|possible|sure>_<class>.nii.gz`` (uint8) of :func:`mcseg.conformal.fit.case_sets` with
    ``affine`` (the header of ``source``, the case's label or image, copied where it matches); the names."""
    from mcseg.data.io import write_nifti

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for k, masks in sets.items():
        for kind in KINDS:
            file = f"{case}_{kind}_{_file_name(names[k])}.nii.gz"
            write_nifti(folder / file, masks[kind].astype(np.uint8), affine, source)
            files.append(file)
    return files

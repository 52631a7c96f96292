"""Post-hoc calibration of a trained run: fit on the validation split, save, apply at evaluation.

``fit_posthoc`` segments the validation cases with the run's predictor, keeps a voxel sample
(by default all foreground voxels of each case plus as many random background voxels, the
reference protocol for 3D volumes; ``voxels: all`` keeps every voxel, the plain NLL of Guo et
al.; then at most ``max_voxels`` in all, drawn uniformly), fits each
requested scaler (:mod:`mcseg.calibration.scaling`) and writes ``<run>/calibration.json``.
The evaluation then reports every metric before (``pre_T``) and after (``post_T``) scaling.

``calibration.json`` holds one fit per checkpoint, keyed by the checkpoint file's sha256
(``{"fits": {sha256: record}}``), never by its file name: fits of several checkpoints coexist,
and a different model that happens to have the same file name is fitted anew. A fitted
temperature outside ``PLAUSIBLE_TEMPERATURE`` is kept but warned about (and listed in the
record's ``warnings``): it usually means too few validation voxels.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mcseg.calibration.scaling import SCALERS, fit_scaler
from mcseg.data.cases import CaseData
from mcseg.data.io import write_json
from mcseg.errors import ConfigError

log = logging.getLogger(__name__)

CALIBRATION_FILE = "calibration.json"
VOXEL_SAMPLES = ("balanced", "all")
# Fitted temperatures outside this range are legal but suspicious (e.g. T = 6223 on one validation case).
PLAUSIBLE_TEMPERATURE = (0.05, 20.0)


@dataclass
class PosthocConfig:
    """Mirrors the config node ``posthoc`` (configs/posthoc/default.yaml)."""

    fit: list[str] = field(default_factory=lambda: ["temperature", "vector"])
    apply: list[str] = field(default_factory=lambda: ["temperature", "vector"])
    max_voxels: int = 2_000_000
    max_iter: int = 100
    seed: int = 0
    refit: bool = False
    voxels: str = "balanced"  # balanced: all foreground + as many background voxels per case | all: every voxel

    def __post_init__(self) -> None:
        for key in ("fit", "apply"):
            bad = [s for s in getattr(self, key) if s not in SCALERS]
            if bad:
                raise ConfigError(f"config key 'posthoc.{key}': unknown scaler {bad[0]!r} (expected {', '.join(SCALERS)})")
        if self.voxels not in VOXEL_SAMPLES:
            raise ConfigError(f"config key 'posthoc.voxels': expected one of {', '.join(VOXEL_SAMPLES)}, "
                              f"got {self.voxels!r}")
        if self.max_voxels < 1 or self.max_iter < 1:
            raise ConfigError("config keys 'posthoc.max_voxels' and 'posthoc.max_iter' must be >= 1")


def _sample_voxels(logits: torch.Tensor, label: torch.Tensor, multilabel: bool, generator: torch.Generator,
                   voxels: str = "balanced") -> tuple[torch.Tensor, torch.Tensor]:
    """(N x K logits, targets) of one case: every voxel (``all``), or all foreground voxels plus as
    many random background ones (``balanced``)."""
    k = logits.shape[0]
    flat_logits = logits.reshape(k, -1).T
    flat_label = label.reshape(k, -1).T if multilabel else label.reshape(-1)
    if voxels == "all":
        return flat_logits.float(), flat_label
    foreground = flat_label.any(1) if multilabel else flat_label > 0
    fg_idx = torch.nonzero(foreground).flatten()
    bg_idx = torch.nonzero(~foreground).flatten()
    n_bg = min(len(bg_idx), max(len(fg_idx), 1))
    pick = torch.randperm(len(bg_idx), generator=generator)[:n_bg].to(bg_idx.device)
    idx = torch.cat([fg_idx, bg_idx[pick]])
    return flat_logits[idx].float(), flat_label[idx]


def collect_validation_voxels(predictor, cases: Iterable[CaseData], max_voxels: int, seed: int,
                              voxels: str = "balanced") -> tuple[torch.Tensor, torch.Tensor, int]:
    """Logits and targets of the voxel sample over ``cases`` (in the network's space); also the case count."""
    generator = torch.Generator().manual_seed(seed)
    predictor.model.eval()
    logits_parts, target_parts, n_cases = [], [], 0
    for case in cases:
        if case.label is None:
            raise ValueError(f"post-hoc calibration: validation case {case.case_id} has no label")
        logits = predictor.logits(case)
        label = torch.from_numpy(np.asarray(case.label)).to(logits.device)
        z, y = _sample_voxels(logits, label, predictor.multilabel, generator, voxels)
        logits_parts.append(z.cpu())
        target_parts.append(y.cpu())
        n_cases += 1
    if not n_cases:
        raise ValueError("post-hoc calibration needs validation cases; the validation split is empty")
    logits, target = torch.cat(logits_parts), torch.cat(target_parts)
    if len(logits) > max_voxels:
        keep = torch.randperm(len(logits), generator=generator)[:max_voxels]
        logits, target = logits[keep], target[keep]
    return logits, target, n_cases


def fit_posthoc(predictor, cases: Iterable[CaseData], cfg: PosthocConfig, where: Path, checkpoint: dict,
                provenance: dict | None = None) -> dict:
    """Fit ``cfg.fit`` scalers on the validation ``cases`` and add them to ``<where>/calibration.json``.

    ``checkpoint``: the identity of the checkpoint whose predictor this is
    (:func:`mcseg.engine.provenance.checkpoint_identity`; its ``sha256`` is the record's key);
    ``provenance``: more of what produced the fit (dataset identity, overrides) for the record.
    """
    ids: list[str] = []

    def noted(cases_: Iterable[CaseData]):
        for case in cases_:
            ids.append(case.case_id)
            yield case

    logits, target, n_cases = collect_validation_voxels(predictor, noted(cases), cfg.max_voxels, cfg.seed, cfg.voxels)
    record = {"fitted_on": "val", "checkpoint": checkpoint, "val_cases": ids, **(provenance or {}),
              "n_cases": n_cases, "n_voxels": len(logits),
              "sampling": ("every voxel" if cfg.voxels == "all" else
                           "all foreground voxels + equally many random background voxels per case")
                          + f", then at most {cfg.max_voxels} uniformly", "objective": "NLL, L-BFGS, float32",
              "scalers": {}, "warnings": []}
    link = predictor.link
    for kind in cfg.fit:
        record["scalers"][kind] = fit_scaler(kind, logits, target, link, predictor.multilabel, cfg.max_iter)
        log.info("post-hoc %s scaling: %s", kind, {k: v for k, v in record["scalers"][kind].items()
                                                    if k in ("temperature", "nll_before", "nll_after")})
        t = record["scalers"][kind].get("temperature")
        if t is not None and not PLAUSIBLE_TEMPERATURE[0] <= t <= PLAUSIBLE_TEMPERATURE[1]:
            message = (f"post-hoc temperature T={t:.4g} fitted on {n_cases} validation case(s), {len(logits)} voxels, "
                       f"is outside {PLAUSIBLE_TEMPERATURE}: the validation split is probably too small to fit it")
            log.warning(message)
            record["warnings"].append(message)
    path = Path(where) / CALIBRATION_FILE
    stored = _read_calibration(path) or {"fits": {}}
    stored["fits"][checkpoint["sha256"]] = record
    write_json(path, stored)
    return record


def _read_calibration(path: Path) -> dict | None:
    """The whole calibration.json (``{"fits": {sha256: record}}``); a file of an older version, whose one
    fit is keyed by a file name only, is kept under ``"unkeyed"`` and matches no checkpoint."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); delete it or pass posthoc.refit=true") from None
    if "fits" not in stored:
        stored = {"fits": {}, "unkeyed": stored}
    return stored


def load_calibration(where: Path, sha256: str) -> dict | None:
    """The fit of the checkpoint whose file has hash ``sha256`` in ``<where>/calibration.json``, or None."""
    stored = _read_calibration(Path(where) / CALIBRATION_FILE)
    return (stored or {}).get("fits", {}).get(sha256)


def scalers_to_apply(record: dict | None, names: list[str], where: Path) -> dict[str, dict]:
    """The fitted parameters of each scaler in ``names``; an error names a scaler that was not fitted."""
    if not names:
        return {}
    fitted = (record or {}).get("scalers", {})
    missing = [n for n in names if n not in fitted]
    if missing:
        raise ValueError(f"posthoc.apply={names}: {missing[0]!r} was not fitted for {where} "
                         f"(add it to posthoc.fit, or pass posthoc.refit=true)")
    return {n: fitted[n] for n in names}

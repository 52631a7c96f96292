"""Post-hoc scalers behind one small interface, so that temperature scaling, vector scaling, local
temperature scaling and any later method are interchangeable.

A scaler is fitted on validation data (:class:`FitData`), applied to one case's channels-first
logits (``K x *S``), saved to a JSON-able record (plus files in the run directory, for a network)
and rebuilt from that record; ``describe()`` is the short summary a log line or report shows.
``SCALER_TYPES`` maps a name (as in ``posthoc.fit``) to its class.

NOT YET WIRED: ``mcseg.calibration.posthoc`` and ``mcseg/evaluate.py`` still call
:func:`~mcseg.calibration.scaling.fit_scaler` / ``scale_logits`` directly (docs/posthoc.md).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from mcseg.calibration.lts import CaseLogits, LTSConfig, LTSNet, fit_lts, load_lts, save_lts
from mcseg.calibration.scaling import fit_scaler, scale_logits


@dataclass
class FitData:
    """What a scaler is fitted on.

    ``voxels``: ``(N x K logits, targets)``, the voxel sample of the validation cases (what
    ``posthoc.collect_validation_voxels`` returns), for the voxel-wise scalers; ``cases``: the whole
    validation cases, for the spatial ones (LTS). ``link``: logits -> probabilities (the loss's
    inverse link); ``None`` means softmax. ``multilabel``: targets are region masks.
    """

    voxels: tuple[Tensor, Tensor] | None = None
    cases: Sequence[CaseLogits] | None = None
    link: Callable[[Tensor], Tensor] | None = None
    multilabel: bool = False


class Scaler(ABC):
    """Fit on validation data, apply to logits, save/load, describe."""

    name: ClassVar[str]
    preserves_argmax: ClassVar[bool]

    @abstractmethod
    def fit(self, data: FitData) -> dict:
        """Fit on ``data``; return the record to store (``nll_before``, ``nll_after`` and parameters)."""

    @abstractmethod
    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        """Calibrated logits of one case (``K x *S``; ``image`` ``C x *S`` for scalers that use it)."""

    @abstractmethod
    def save(self, directory: Path) -> dict:
        """JSON-able record (the fit's record plus what :meth:`load` needs); may write files in ``directory``."""

    @classmethod
    @abstractmethod
    def load(cls, record: dict, directory: Path) -> Scaler:
        """Rebuild from :meth:`save`'s record (files read from ``directory``)."""

    def describe(self) -> str:
        return self.name


def _softmax(z: Tensor) -> Tensor:
    return torch.softmax(z, dim=1)


class _VoxelScaler(Scaler):
    """Adapter for the L-BFGS scalers of :mod:`mcseg.calibration.scaling` (parameters in the record)."""

    kind: ClassVar[str]

    def __init__(self, record: dict | None = None, max_iter: int = 100) -> None:
        self.record, self.max_iter = record, max_iter

    def fit(self, data: FitData) -> dict:
        if data.voxels is None:
            raise ValueError(f"post-hoc scaler {self.name!r} is fitted on a voxel sample; none was given")
        logits, target = data.voxels
        self.record = fit_scaler(self.kind, logits, target, data.link or _softmax, data.multilabel, self.max_iter)
        return self.record

    def _fitted(self) -> dict:
        if self.record is None:
            raise RuntimeError(f"post-hoc scaler {self.name!r} is not fitted")
        return self.record

    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        return scale_logits(logits, self._fitted(), channel_dim=0)

    def save(self, directory: Path) -> dict:
        return dict(self._fitted())

    @classmethod
    def load(cls, record: dict, directory: Path) -> Scaler:
        return cls(dict(record))


class TemperatureScaler(_VoxelScaler):
    """Temperature scaling (Guo et al. 2017): ``z / T``, one T > 0."""

    name = kind = "temperature"
    preserves_argmax = True

    def describe(self) -> str:
        return f"temperature T={self._fitted()['temperature']:.4g}"


class VectorScaler(_VoxelScaler):
    """Vector scaling (Guo et al. 2017): ``w_k z_k + b_k`` (may change the arg-max)."""

    name = kind = "vector"
    preserves_argmax = False


class LTSScaler(Scaler):
    """Local temperature scaling (:mod:`mcseg.calibration.lts`); weights in ``<directory>/<weights_file>``."""

    name = "lts"
    preserves_argmax = True
    weights_file = "lts.pt"

    def __init__(self, cfg: LTSConfig | None = None, net: LTSNet | None = None, record: dict | None = None) -> None:
        self.cfg, self.net, self.record = cfg or LTSConfig(), net, record

    def fit(self, data: FitData) -> dict:
        if not data.cases:
            raise ValueError("post-hoc scaler 'lts' is fitted on whole validation cases; none were given")
        self.net, self.record = fit_lts(data.cases, self.cfg, data.link, data.multilabel)
        return self.record

    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        if self.net is None:
            raise RuntimeError("post-hoc scaler 'lts' is not fitted")
        return self.net.apply(logits, image if self.net.image_channels else None, self.cfg.slice_axis, self.cfg.chunk)

    def save(self, directory: Path) -> dict:
        if self.net is None or self.record is None:
            raise RuntimeError("post-hoc scaler 'lts' is not fitted")
        sha = save_lts(self.net, Path(directory) / self.weights_file)
        return {**self.record, "weights": self.weights_file, "weights_sha256": sha}

    @classmethod
    def load(cls, record: dict, directory: Path) -> Scaler:
        try:
            cfg = LTSConfig(**record["config"])
            path = Path(directory) / record["weights"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{directory}: the 'lts' record of calibration.json is incomplete ({exc}); "
                             f"refit post-hoc calibration (posthoc.refit=true)") from None
        return cls(cfg, load_lts(path, record.get("weights_sha256")), dict(record))

    def describe(self) -> str:
        r = self.record or {}
        return (f"lts ({self.cfg.dims}D, image={'yes' if self.cfg.use_image else 'no'}; held-out NLL "
                f"{r.get('nll_before', float('nan')):.4g} -> {r.get('nll_after', float('nan')):.4g})")


SCALER_TYPES: dict[str, type[Scaler]] = {s.name: s for s in (TemperatureScaler, VectorScaler, LTSScaler)}


def build_scaler(name: str, **options) -> Scaler:
    """A new, unfitted scaler ``name`` (``lts`` takes ``cfg=LTSConfig(...)``; the others ``max_iter``)."""
    if name not in SCALER_TYPES:
        raise ValueError(f"post-hoc scaler {name!r}: expected one of {', '.join(SCALER_TYPES)}")
    return SCALER_TYPES[name](**options)


def load_scaler(name: str, record: dict, directory: Path) -> Scaler:
    """The fitted scaler ``name`` from its calibration.json ``record`` (files under ``directory``)."""
    if name not in SCALER_TYPES:
        raise ValueError(f"calibration.json: unknown post-hoc scaler {name!r} (expected one of "
                         f"{', '.join(SCALER_TYPES)}); refit with posthoc.refit=true")
    return SCALER_TYPES[name].load(record, directory)


__all__ = ["FitData", "LTSScaler", "SCALER_TYPES", "Scaler", "TemperatureScaler", "VectorScaler",
           "build_scaler", "load_scaler"]

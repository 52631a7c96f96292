"""The post-hoc scaler interface and the temperature family, so that temperature scaling, vector scaling, local
temperature scaling and any later method are interchangeable.

A scaler is fitted on validation data (:class:`FitData`), applied to one case's channels-first
logits (``K x *S``), saved to a JSON-able record (plus files in the run directory, for a network)
and rebuilt from that record; ``describe()`` is the short summary a log line or report shows
(with how the scaler was fitted: which voxels, which objective). The registry of every scaler by name
(``SCALER_TYPES``: these, histogram binning and isotonic regression, Fiducio's calibrators) is
:mod:`mcseg.calibration.scaler_registry`; :mod:`mcseg.calibration.posthoc` and the evaluation use only this interface.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch
from torch import Tensor

from mcseg.calibration.lts import CaseLogits, LTSNet, fit_lts, load_lts, save_lts
from mcseg.calibration.lts_config import LTSConfig
from mcseg.calibration.logit_scaling import fit_scaler, fit_temperature_ece, scale_logits


@dataclass
class FitOptions:
    """How scalers are fitted (from the ``posthoc`` config node); each scaler reads what it needs."""

    max_iter: int = 100          # L-BFGS iterations (temperature and vector, NLL)
    objective: str = "nll"       # nll | ece (temperature only)
    n_bins: int = 15             # ECE bins of the ece objective (the protocol's evaluation.n_bins)
    lts: LTSConfig = field(default_factory=LTSConfig)
    histogram_bins: int = 15     # equal-width bins of histogram binning (mcseg.calibration.binning_adapters)
    fiducio: dict = field(default_factory=dict)  # Fiducio's fit settings (posthoc.fiducio); {}: its defaults


@dataclass
class FitData:
    """What a scaler is fitted on.

    ``voxels``: ``(N x K logits, targets)``, the voxel sample of the validation cases (what
    ``posthoc.collect_validation_voxels`` returns), for the voxel-wise scalers; ``cases``: the whole
    validation cases, for the spatial ones (LTS). ``link``: logits -> probabilities (the loss's
    inverse link); ``None`` means softmax. ``multilabel``: targets are region masks. ``sample``:
    which voxels ``voxels`` holds (e.g. ``{"voxels": "region", "region": "union_foreground"}``),
    recorded with each fit.
    """

    voxels: tuple[Tensor, Tensor] | None = None
    cases: Sequence[CaseLogits] | None = None
    link: Callable[[Tensor], Tensor] | None = None
    multilabel: bool = False
    sample: dict = field(default_factory=dict)


class Scaler(ABC):
    """Fit on validation data, apply to logits, save/load, describe."""

    name: ClassVar[str]
    preserves_argmax: ClassVar[bool]
    # what it guarantees, recorded in calibration.json: "order" (the class order, hence the arg-max), "argmax"
    # (the arg-max only) or "none"; tests/test_fiducio_scalers.py checks it against preserves_argmax and the maps
    guarantee: ClassVar[str] = "none"
    softmax_only: ClassVar[bool] = False  # refused for a multi-label (sigmoid per region) model, at start
    fitted_on: ClassVar[Literal["voxels", "cases"]] = "voxels"  # what FitData must hold for it
    objectives: ClassVar[tuple[str, ...]] = ("nll",)  # the posthoc.objective values it can be fitted by
    record: dict | None = None

    @classmethod
    def configured(cls, options: FitOptions) -> Scaler:
        """A new, unfitted scaler set up by ``options``."""
        return cls()

    @property
    def uses_image(self) -> bool:
        """Whether :meth:`apply` needs the case's image."""
        return False

    def to(self, device: torch.device | str) -> Scaler:
        """Move what :meth:`apply` computes with to ``device`` (a network's weights); returns self."""
        return self

    @abstractmethod
    def fit(self, data: FitData) -> dict:
        """Fit on ``data``; return the record to store (``nll_before``, ``nll_after`` and parameters)."""

    @abstractmethod
    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        """Calibrated logits of one case (``K x *S``; ``image`` ``C x *S`` for scalers that use it)."""

    @abstractmethod
    def save(self, directory: Path, key: str = "") -> dict:
        """JSON-able record (the fit's record plus what :meth:`load` needs); may write files in ``directory``,
        named with ``key`` (the checkpoint's sha256) so that the fits of several checkpoints coexist."""

    @classmethod
    @abstractmethod
    def load(cls, record: dict, directory: Path) -> Scaler:
        """Rebuild from :meth:`save`'s record (files read from ``directory``)."""

    def n_parameters(self) -> int | None:
        """How many numbers the fit chose (a temperature: 1; vector scaling: 2K; a network: its weights), to be
        weighed against the voxels it was fitted on (:func:`mcseg.calibration.posthoc.fit_posthoc` warns of too few);
        None: not counted."""
        return None

    def how(self) -> str:
        """How it was fitted, e.g. ``region, ece`` (from the record; empty for a record without it)."""
        r = self.record or {}
        return ", ".join(str(r[k]) for k in ("voxels", "objective") if r.get(k))

    def label(self) -> str:
        """The name with how it was fitted, e.g. ``temperature (region, ece)``: a report row's label."""
        return f"{self.name} ({self.how()})" if self.how() else self.name

    def describe(self) -> str:
        return self.label()


def _softmax(z: Tensor) -> Tensor:
    return torch.softmax(z, dim=1)


class _VoxelScaler(Scaler):
    """Adapter for the L-BFGS scalers of :mod:`mcseg.calibration.logit_scaling` (parameters in the record)."""

    kind: ClassVar[str]

    def __init__(self, record: dict | None = None, max_iter: int = 100, objective: str = "nll", n_bins: int = 15) -> None:
        if objective not in self.objectives:
            raise ValueError(f"post-hoc scaler {self.name!r} is fitted by {' or '.join(self.objectives)}, "
                             f"not {objective!r} (config key 'posthoc.objective')")
        self.record, self.max_iter, self.objective, self.n_bins = record, max_iter, objective, n_bins

    @classmethod
    def configured(cls, options: FitOptions) -> Scaler:
        return cls(max_iter=options.max_iter, objective=options.objective, n_bins=options.n_bins)

    def fit(self, data: FitData) -> dict:
        if data.voxels is None:
            raise ValueError(f"post-hoc scaler {self.name!r} is fitted on a voxel sample; none was given")
        logits, target = data.voxels
        link = data.link or _softmax
        if self.objective == "ece":
            fitted = fit_temperature_ece(logits, target, link, data.multilabel, self.n_bins)
        else:
            fitted = fit_scaler(self.kind, logits, target, link, data.multilabel, self.max_iter)
        self.record = {**fitted, **data.sample, "objective": self.objective,
                       **({"n_bins": self.n_bins} if self.objective == "ece" else {})}
        return self.record

    def _fitted(self) -> dict:
        if self.record is None:
            raise RuntimeError(f"post-hoc scaler {self.name!r} is not fitted")
        return self.record

    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        return scale_logits(logits, self._fitted(), channel_dim=0)

    def n_parameters(self) -> int | None:
        """T, or the K weights and K biases."""
        record = self._fitted()
        return sum(torch.as_tensor(record[k]).numel() for k in ("temperature", "weight", "bias") if k in record)

    def save(self, directory: Path, key: str = "") -> dict:
        return dict(self._fitted())

    @classmethod
    def load(cls, record: dict, directory: Path) -> Scaler:
        return cls(dict(record))


class TemperatureScaler(_VoxelScaler):
    """Temperature scaling (Guo et al. 2017): ``z / T``, one T > 0."""

    name = kind = "temperature"
    preserves_argmax = True
    guarantee = "order"
    objectives = ("nll", "ece")

    def describe(self) -> str:
        return f"{self.label()} T={self._fitted()['temperature']:.4g}"


class VectorScaler(_VoxelScaler):
    """Vector scaling (Guo et al. 2017): ``w_k z_k + b_k`` (may change the arg-max)."""

    name = kind = "vector"
    preserves_argmax = False


class LTSScaler(Scaler):
    """Local temperature scaling (:mod:`mcseg.calibration.lts`); weights in ``<directory>/<weights_file>``."""

    name = "lts"
    preserves_argmax = True
    guarantee = "order"  # z / T(x) with T(x) > 0 per voxel
    fitted_on = "cases"

    def __init__(self, cfg: LTSConfig | None = None, net: LTSNet | None = None, record: dict | None = None) -> None:
        self.cfg, self.net, self.record = cfg or LTSConfig(), net, record

    @classmethod
    def configured(cls, options: FitOptions) -> Scaler:
        return cls(options.lts)

    @staticmethod
    def weights_file(key: str = "") -> str:
        """``lts-<sha8>.pt`` for the checkpoint whose sha256 is ``key`` (``lts.pt`` without one)."""
        return f"lts-{key[:8]}.pt" if key else "lts.pt"

    @property
    def uses_image(self) -> bool:
        return bool(self.net is not None and self.net.image_channels)

    def to(self, device: torch.device | str) -> Scaler:
        if self.net is not None:
            self.net.to(device)
        return self

    def fit(self, data: FitData) -> dict:
        if not data.cases:
            raise ValueError("post-hoc scaler 'lts' is fitted on whole validation cases; none were given")
        self.net, record = fit_lts(data.cases, self.cfg, data.link, data.multilabel)
        self.record = {**record, "voxels": "cases", "objective": "nll", "n_cases": len(data.cases)}
        return self.record

    def n_parameters(self) -> int | None:
        """The temperature network's weights."""
        return None if self.net is None else sum(p.numel() for p in self.net.parameters())

    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        if self.net is None:
            raise RuntimeError("post-hoc scaler 'lts' is not fitted")
        return self.net.apply(logits, image if self.net.image_channels else None, self.cfg.slice_axis, self.cfg.chunk)

    def save(self, directory: Path, key: str = "") -> dict:
        if self.net is None or self.record is None:
            raise RuntimeError("post-hoc scaler 'lts' is not fitted")
        name = self.weights_file(key)
        sha = save_lts(self.net, Path(directory) / name)
        self.record = {**self.record, "weights": name, "weights_sha256": sha}
        return dict(self.record)

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

    def label(self) -> str:
        return f"lts ({self.cfg.dims}D{', image' if self.cfg.use_image else ''}, nll)"


__all__ = ["FitData", "FitOptions", "LTSScaler", "Scaler", "TemperatureScaler", "VectorScaler"]

"""Fiducio's post-hoc calibrators (fiducio 0.2.0; Kirscher et al., TMLR 2026) behind mcseg's scaler interface.

One adapter, :class:`FiducioScaler`, wraps any Fiducio calibrator class; :data:`FIDUCIO_SCALERS` declares each
one mcseg offers, with its name (as in ``posthoc.fit``, evaluate.py's ``posthoc.apply`` and
``mcseg-calibrate-folder --scaler``) and what it guarantees (``guarantee``, recorded in calibration.json):

* ``order``: the calibrated probabilities rank the classes as the raw ones (so the arg-max is kept);
* ``argmax``: the arg-max is kept, the order of the other classes is not;
* ``none``: the arg-max can move (the segmentation, its Dice and HD95 change).

Temperature and vector scaling are NOT offered twice: mcseg's own ``temperature`` and ``vector``
(:mod:`mcseg.calibration.logit_scaling`) are the one implementation of each. They fit the same objective as Fiducio's
TS and VS (mean cross-entropy of the same voxels, L-BFGS) and agree with them (tests/test_fiducio_scalers.py,
docs/posthoc.md), and mcseg's also serve what Fiducio does not: sigmoid (multi-label) and other inverse links
(SPA), the ECE objective, and the fall-back to the identity when a fit would raise the NLL.

How they are fitted: on the voxel sample mcseg selects (``posthoc.voxels``, ``max_voxels``, ``seed``: the
``voxels`` of :class:`~mcseg.calibration.scaler_registry.FitData`), as an ``N x K`` table of logits, on the CPU, by the
library's own defaults (Adam, 200 steps; learning rate 0.1, 0.01 for the class-conditional family; no
regulariser) unless ``posthoc.fiducio`` sets some of ``FIDUCIO_SETTINGS`` (:mod:`mcseg.calibration.scaler_names`;
each calibrator gets those its constructor takes; the constructor's arguments are recorded). With the defaults
Adam keeps the iterate of lowest training loss, the start (the identity map) included, so a fit never raises the
NLL of its voxels; a fit that does (L-BFGS, a regulariser) is kept and its record says so (``warning``). Softmax
models only: Fiducio's maps are maps of a softmax's logits or log-probabilities, so a multi-label (sigmoid) model is
refused. On saved probabilities (``mcseg-calibrate-folder``) the "logits" are ``ln p``
(:func:`mcseg.evaluation.folder_posthoc.log_probabilities`): the log-probability calibrators (DC, CMS, CMSap, CMSop)
and the translation-invariant ones (ETS, MSc) are then the logits' own maps; MS is a map of the log-probabilities,
not of the logits (trap 1 of the reference document).

Saved in Fiducio's own format (``fiducio.save_calibrator``) beside calibration.json as
``fiducio-<name>-<sha8>.pt`` (the checkpoint's sha256, as LTS weights are named), so that
``fiducio.load_calibrator(path)`` reads it; the file's sha256 is recorded and checked on load. Applied to one case
at a time in slabs of the first spatial axis (at most :data:`CHUNK_VOXELS` voxels each), so that Fiducio's
internal ``N x K`` copies never hold more than one slab.
"""
from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import fiducio
import torch
from torch import Tensor

from mcseg.calibration.scaler_interface import FitData, FitOptions, Scaler
from mcseg.calibration.logit_scaling import nll
from mcseg.calibration.scaler_names import FIDUCIO_SETTINGS, softmax_only_message

__all__ = ["CHUNK_VOXELS", "FIDUCIO_SCALERS", "FIDUCIO_SCALER_TYPES", "FiducioScaler", "GUARANTEES",
           "check_fiducio_settings"]

GUARANTEES = ("order", "argmax", "none")
KEEPS = {"order": "keeps the class order", "argmax": "keeps the arg-max", "none": "can change the arg-max"}
#: voxels per slab of :meth:`FiducioScaler.apply`
CHUNK_VOXELS = 1 << 20


@dataclass(frozen=True)
class Offered:
    """One Fiducio calibrator as mcseg offers it."""

    name: str
    calibrator: type
    guarantee: str
    summary: str


FIDUCIO_SCALERS = (
    Offered("ets", fiducio.EnsembleTemperatureScaling, "order",
            "ensemble temperature scaling: w0 softmax(z/T) + w1 softmax(z) + w2 uniform (one network's logits; "
            "no ensemble members needed)"),
    Offered("ms", fiducio.MatrixScaling, "none", "matrix scaling W z + b of the logits"),
    Offered("msc", fiducio.TranslationInvariantMatrixScaling, "none",
            "matrix scaling with equal row sums (invariant to a per-voxel logit offset)"),
    Offered("dirichlet", fiducio.DirichletCalibration, "none", "Dirichlet calibration W log p + b"),
    Offered("cms", fiducio.ClassConditionalMatrixScaling, "none",
            "class-conditional matrix scaling (CMS/CDC): one affine map of log p per predicted class"),
    Offered("cmsap", fiducio.ArgmaxPreservingMatrixScaling, "argmax",
            "argmax-preserving class-conditional matrix scaling (CMSap)"),
    Offered("cmsop", fiducio.OrderPreservingMatrixScaling, "order",
            "order-preserving class-conditional matrix scaling (CMSop)"),
)


class FiducioScaler(Scaler):
    """A Fiducio calibrator as a :class:`~mcseg.calibration.scaler_registry.Scaler` (module docstring); one subclass per
    entry of :data:`FIDUCIO_SCALERS` sets ``name``, ``calibrator_class`` and ``guarantee``."""

    calibrator_class: ClassVar[type]
    guarantee: ClassVar[str]
    softmax_only = True

    def __init__(self, calibrator=None, record: dict | None = None, path: Path | None = None,
                 settings: dict | None = None) -> None:
        self.calibrator, self.record, self.path, self.settings = calibrator, record, path, dict(settings or {})

    @classmethod
    def configured(cls, options: FitOptions) -> Scaler:
        return cls(settings=options.fiducio)

    @classmethod
    def new_calibrator(cls, settings: dict, device: str = "cpu"):
        """An unfitted calibrator of ``cls``, given the ``settings`` its constructor takes."""
        taken = inspect.signature(cls.calibrator_class).parameters
        return cls.calibrator_class(device=device, **{k: v for k, v in settings.items() if k in taken})

    @staticmethod
    def file_name(name: str, key: str = "") -> str:
        """``fiducio-<name>-<sha8>.pt`` for the checkpoint whose sha256 is ``key`` (``fiducio-<name>.pt`` without)."""
        return f"fiducio-{name}-{key[:8]}.pt" if key else f"fiducio-{name}.pt"

    def fit(self, data: FitData) -> dict:
        if data.multilabel:
            raise ValueError(softmax_only_message(self.name, "config key 'posthoc.fit'"))
        if data.voxels is None:
            raise ValueError(f"post-hoc scaler {self.name!r} is fitted on a voxel sample; none was given")
        logits, target = data.voxels
        logits, target = logits.detach().float().cpu(), target.long().cpu()
        calibrator = self.new_calibrator(self.settings)
        calibrator.fit(logits, target)
        with torch.no_grad():
            before = float(nll(torch.softmax(logits, 1), target, False))
            after = float(nll(calibrator.transform(logits), target, False))
        self.calibrator, self.path = calibrator, None
        # Adam keeps its best iterate (the identity start included); L-BFGS or a regulariser can end above it
        rose = {"warning": f"the fit raised the NLL of its voxels ({before:.6g} -> {after:.6g}); kept as fitted, "
                           f"not replaced by the identity"} if not after <= before else {}
        self.record = {"calibrator": type(calibrator).__name__, "fiducio_id": calibrator.calibrator_id,
                       "fiducio_version": fiducio.__version__, "config": calibrator.get_config(),
                       "guarantee": self.guarantee, "nll_before": before, "nll_after": after,
                       **data.sample, "objective": "nll", **rose}
        return self.record

    def _fitted(self):
        if self.calibrator is None or self.record is None:
            raise RuntimeError(f"post-hoc scaler {self.name!r} is not fitted")
        return self.calibrator

    def n_parameters(self) -> int | None:
        """The numbers of the fitted calibrator's state (its weights, biases, temperatures)."""
        state = getattr(self._fitted(), "_get_state", lambda: None)()
        return None if not isinstance(state, dict) else \
            sum(int(v.numel()) for v in state.values() if isinstance(v, torch.Tensor))

    def to(self, device: torch.device | str) -> Scaler:
        """Reload the saved calibrator onto ``device`` (Fiducio computes on its calibrator's device)."""
        if self.path is not None and torch.device(device) != self._fitted().device:
            self.calibrator = fiducio.load_calibrator(self.path, map_location=device)
        return self

    def apply(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        """Calibrated logits of one case (``K x *S``), slab by slab along the first spatial axis."""
        calibrator = self._fitted()
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        per_slice = max(1, logits[0, 0].numel()) if logits.ndim > 2 else 1
        step = max(1, CHUNK_VOXELS // per_slice)
        with torch.no_grad():
            for start in range(0, logits.shape[1], step):
                slab = logits[None, :, start:start + step].to(calibrator.device)
                out[:, start:start + step] = calibrator.decision_function(slab)[0].to(out.device)
        return out

    def save(self, directory: Path, key: str = "") -> dict:
        calibrator = self._fitted()
        name = self.file_name(self.name, key)
        path = Path(directory) / name
        fiducio.save_calibrator(calibrator, path)
        self.path = path
        self.record = {**self.record, "file": name, "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        return dict(self.record)

    @classmethod
    def load(cls, record: dict, directory: Path) -> Scaler:
        try:
            path = Path(directory) / record["file"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{directory}: the {cls.name!r} record of calibration.json is incomplete ({exc}); "
                             f"refit post-hoc calibration (posthoc.refit=true)") from None
        if not path.is_file():
            raise OSError(f"{path}: the {cls.name!r} calibrator file is missing; refit post-hoc calibration "
                          f"(posthoc.refit=true)")
        if record.get("file_sha256") and hashlib.sha256(path.read_bytes()).hexdigest() != record["file_sha256"]:
            raise ValueError(f"{path}: does not match the sha256 recorded in calibration.json for {cls.name!r}; "
                             f"refit post-hoc calibration (posthoc.refit=true)")
        calibrator = fiducio.load_calibrator(path)
        if type(calibrator) is not cls.calibrator_class:
            raise ValueError(f"{path}: holds a {type(calibrator).__name__}, not the {cls.calibrator_class.__name__} "
                             f"of {cls.name!r}; refit post-hoc calibration (posthoc.refit=true)")
        return cls(calibrator, dict(record), path)

    def describe(self) -> str:
        r = self.record or {}
        return (f"{self.label()} [Fiducio {r.get('calibrator', self.calibrator_class.__name__)}, "
                f"{KEEPS[self.guarantee]}]")


def check_fiducio_settings(settings: dict, names: list[str]) -> None:
    """Refuse ``posthoc.fiducio`` settings outside :data:`~mcseg.calibration.scaler_names.FIDUCIO_SETTINGS`, or that a
    Fiducio calibrator of ``names`` (those of ``posthoc.fit``) refuses (an unknown optimizer, a negative learning
    rate...), naming the key."""
    from mcseg.errors import ConfigError

    unknown = sorted(set(settings) - set(FIDUCIO_SETTINGS))
    if unknown:
        raise ConfigError(f"config key 'posthoc.fiducio.{unknown[0]}': not a Fiducio fit setting (expected "
                          f"{', '.join(FIDUCIO_SETTINGS)})")
    for name in names:
        try:
            FIDUCIO_SCALER_TYPES[name].new_calibrator(settings)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"config key 'posthoc.fiducio'={dict(settings)}: {name} refuses it ({exc})") from None


def _scaler_class(offered: Offered) -> type[FiducioScaler]:
    if offered.guarantee not in GUARANTEES:
        raise ValueError(f"Fiducio scaler {offered.name!r}: guarantee {offered.guarantee!r} is not one of {GUARANTEES}")
    return type(f"Fiducio_{offered.name}", (FiducioScaler,), {
        "name": offered.name, "calibrator_class": offered.calibrator, "guarantee": offered.guarantee,
        "preserves_argmax": offered.guarantee != "none", "__doc__": f"{offered.summary} (Fiducio)."})


#: Fiducio's calibrators by name (registered in mcseg.calibration.scaler_registry.SCALER_TYPES)
FIDUCIO_SCALER_TYPES: dict[str, type[FiducioScaler]] = {o.name: _scaler_class(o) for o in FIDUCIO_SCALERS}

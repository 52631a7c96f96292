"""Corruptions of a raw case at a fixed severity: the data transforms of an evaluation under shift.

A corruption acts on the case as read from its files (raw intensities, the file's voxel grid and
spacing in mm), before mcseg's preprocessing and normalisation, as a scanner would
(:meth:`mcseg.data.base.SegmentationDataset.corrupted`). A suite (``configs/shift/<name>.yaml``) names
its corruptions, each a *kind* below with one value per level of each parameter; level 0 is the clean case.

Kinds (``KINDS``), with the library transform each one builds. Where the reference scheme (ROOD-MRI,
Boone et al. 2023) draws a parameter from a range at a level (TorchIO's ``±x``), the range is the level
and the draw is fixed by the case's seed; everything else is fixed (MONAI's random-range defaults are
overridden: ``sample_std=False``, a fixed gamma):

============== ======================================================== ==========
kind           transform (library)                                      label
============== ======================================================== ==========
affine         ``tio.RandomAffine(scales=1, degrees=±d, translation=±t)``  moved (nearest)
elastic        ``tio.RandomElasticDeformation(max_displacement=m)``     moved (nearest)
anisotropy     ``tio.RandomAnisotropy(axes, downsampling=(f, f))``      kept
bias_field     ``tio.RandomBiasField(coefficients=±c, order)``          kept
contrast       ``monai.transforms.AdjustContrast(gamma)``, per channel  kept
ghosting       ``tio.RandomGhosting(num_ghosts=(n, n), intensity=(i, i), axes)``, negatives to 0  kept
motion         ``tio.RandomMotion(degrees=±d, translation=±t, num_transforms=n)``, negatives to 0 kept
rician_noise   ``monai.transforms.RandRicianNoise(prob=1, std, relative, channel_wise, sample_std=False)`` kept
gaussian_noise ``monai.transforms.RandGaussianNoise(prob=1, std, sample_std=False)`` (absolute, e.g. HU) kept
blur           ``tio.Blur(std=(s, s, s))``, s in mm                      kept
shift          ``monai.transforms.ShiftIntensity(offset)`` (e.g. HU)    kept
============== ======================================================== ==========

Only the geometric kinds (affine, elastic) move the anatomy, so only they move the label, with nearest
neighbour; the case is then scored on the moved label. The acquisition artefacts leave the truth where it
is (anisotropy too: TorchIO's ``scalars_only=True``; ROOD-MRI downsampled its label as well, which would
score a network against a blocky label).

Randomness: TorchIO draws from torch's global generator, MONAI from the transform's own numpy
``RandomState``; both are seeded with the case's seed (:func:`case_seed` of the suite's seed, the case,
the corruption and the level) inside ``torch.random.fork_rng``, so a corruption repeats bit for bit and
leaves the caller's generators untouched. What was drawn is recorded per case.
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch

from mcseg.data.cases import CaseData
from mcseg.errors import ConfigError


@dataclass
class CorruptionSpec:
    """One corruption of a suite: its kind, its parameters per level (lists, one value per level), fixed ones."""

    kind: str = "???"
    levels: dict[str, list[Any]] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShiftConfig:
    """The ``shift`` node of evaluate.py (configs/shift/*.yaml)."""

    suite: str = "???"
    seed: int = 0  # every case's seed derives from it, the case id, the corruption and the level
    corruptions: list[str] = field(default_factory=list)  # those evaluated (a subset of ``definitions``)
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])  # those evaluated; 0 is the clean evaluation
    alpha: float = 2 / 3  # ROOD-MRI's level weight base: w_s = alpha ** s
    save_predictions: bool = False  # segmentations of every corrupted case (many files)
    save_probabilities: bool = False  # and their probabilities (mcseg-new-cases on a condition: docs/new_cases.md)
    definitions: dict[str, CorruptionSpec] = field(default_factory=dict)
    modality: str | None = None  # CT | MRI: the data the suite is defined for (others refused); null: any


MODALITIES = ("CT", "MRI")
MR_CHANNELS = ("MR", "T1", "T2", "FLAIR", "ADC", "DWI", "PD", "SWI", "DIXON", "CINE")


def modality_of(channel_names) -> str | None:
    """``CT`` or ``MRI`` from channel names (MSD's ``modality``, nnU-Net's ``channel_names``: ``CT``,
    ``non-contrast CT``, ``MRI``, ``T2``, ``FLAIR``, ``ADC`` ...) when they all say the same, else None."""
    import re

    kinds = set()
    for name in channel_names:
        words = re.findall(r"[A-Z0-9]+", str(name).upper())
        if "CT" in words:
            kinds.add("CT")
        elif any(w.startswith(MR_CHANNELS) for w in words):
            kinds.add("MRI")
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def check_modality(shift: "ShiftConfig | None", dataset) -> None:
    """A suite defined for one modality (``shift.modality``) refuses data of another, naming both: CT's noise and
    window shifts are in Hounsfield units, ROOD-MRI's artefacts are MRI's. Data that do not say are warned of."""
    import logging

    if shift is None or shift.modality is None:
        return
    have = getattr(dataset, "modality", None)
    if have is None:
        logging.getLogger(__name__).warning(
            "shift=%s is defined for %s; dataset %s does not say its modality: its corruptions are applied as they "
            "are", shift.suite, shift.modality, dataset.name)
    elif have != shift.modality:
        raise ConfigError(f"shift={shift.suite} is defined for {shift.modality} but dataset {dataset.name} is {have}: "
                          f"choose a suite for {have} (shift={'ct' if have == 'CT' else 'rood_mri'}), or pass "
                          "shift.modality=null to apply it anyway")


def shift_config(node) -> ShiftConfig | None:
    """The checked ``shift`` node, or None when no suite is asked for; errors name the key."""
    from mcseg.config import typed

    if node is None:
        return None
    cfg = typed(node, ShiftConfig, "shift")
    if not cfg.definitions:
        raise ConfigError("config key 'shift.definitions' is empty: choose a suite, e.g. shift=rood_mri")
    if cfg.modality not in (None, *MODALITIES):
        raise ConfigError(f"config key 'shift.modality'={cfg.modality}: expected one of {', '.join(MODALITIES)} "
                          "or null (any data)")
    unknown = [c for c in cfg.corruptions if c not in cfg.definitions]
    if unknown:
        raise ConfigError(f"config key 'shift.corruptions': {unknown} not in suite {cfg.suite} "
                          f"(expected a subset of {list(cfg.definitions)})")
    if not cfg.corruptions:
        raise ConfigError(f"config key 'shift.corruptions' is empty: name some of {list(cfg.definitions)}")
    if len(set(cfg.corruptions)) != len(cfg.corruptions):
        raise ConfigError(f"config key 'shift.corruptions'={cfg.corruptions}: a corruption is named twice")
    for name in cfg.corruptions:
        n = n_levels(cfg.definitions[name], f"shift.definitions.{name}")
        bad = [lv for lv in cfg.levels if not 0 <= lv <= n]
        if bad:
            raise ConfigError(f"config key 'shift.levels'={cfg.levels}: {name} has levels 1..{n} (0 is clean)")
        corruption(name, cfg.definitions[name], 1)  # refuses an unknown kind or parameter now, not mid-suite
    cfg.levels = sorted(set(int(lv) for lv in cfg.levels) - {0})
    if not cfg.levels:
        raise ConfigError("config key 'shift.levels' names no corrupted level (1 and up)")
    if not 0 < cfg.alpha:
        raise ConfigError(f"config key 'shift.alpha'={cfg.alpha}: expected a positive level-weight base")
    return cfg


def n_levels(spec: CorruptionSpec, key: str) -> int:
    lengths = {len(v) for v in spec.levels.values()}
    if len(lengths) != 1:
        raise ConfigError(f"config key '{key}.levels': every parameter needs one value per level "
                          f"(got {({k: len(v) for k, v in spec.levels.items()})})")
    return lengths.pop()


def case_seed(seed: int, case_id: str, corruption_name: str, level: int) -> int:
    """The seed of one (case, corruption, level): 31 bits of sha256 of the four, stable across runs and machines."""
    digest = hashlib.sha256(f"{seed}/{case_id}/{corruption_name}/{level}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------- kinds
def _range(x: float) -> tuple[float, float]:
    return (-float(x), float(x))


def _tio():
    import torchio

    return torchio


def _affine(degrees, translation, dims):
    tio = _tio()
    if dims == 2:  # in-plane rotation and translation of a 2D image (its third axis has one voxel)
        return tio.RandomAffine(scales=(1, 1, 1, 1, 1, 1), degrees=(0, 0, 0, 0, *_range(degrees)),
                                translation=(*_range(translation), *_range(translation), 0, 0))
    return tio.RandomAffine(scales=(1, 1, 1, 1, 1, 1), degrees=float(degrees), translation=float(translation))


def _elastic(max_displacement, dims, num_control_points=7, locked_borders=2):
    m = float(max_displacement)
    return _tio().RandomElasticDeformation(num_control_points=num_control_points, locked_borders=locked_borders,
                                           max_displacement=(m, m, 0.0) if dims == 2 else (m, m, m))


def _anisotropy(downsampling, dims, axes=(0, 1, 2)):
    axes = tuple(int(a) for a in axes if dims == 3 or int(a) != 2)
    if not axes:
        raise ValueError(f"anisotropy along axes {list(axes)}: a 2D image has only axes 0 and 1")
    f = float(downsampling)
    return _tio().RandomAnisotropy(axes=axes, downsampling=(f, f), scalars_only=True)


def _bias_field(coefficients, dims, order=3):
    return _tio().RandomBiasField(coefficients=_range(coefficients), order=int(order))


def _ghosting(num_ghosts, intensity, dims, axes=(0, 1)):
    n, i = int(num_ghosts), float(intensity)
    return _tio().RandomGhosting(num_ghosts=(n, n), intensity=(i, i), axes=tuple(int(a) for a in axes))


def _motion(degrees, translation, num_transforms, dims):
    return _tio().RandomMotion(degrees=_range(degrees), translation=_range(translation),
                               num_transforms=int(num_transforms))


def _blur(std, dims):
    s = float(std)
    return _tio().Blur(std=(s, s, 0.0) if dims == 2 else (s, s, s))


def _contrast(gamma, dims):
    from monai.transforms import AdjustContrast

    return AdjustContrast(gamma=float(gamma))


def _rician(std, dims, relative=True, channel_wise=True):
    from monai.transforms import RandRicianNoise

    return RandRicianNoise(prob=1.0, mean=0.0, std=float(std), channel_wise=bool(channel_wise),
                           relative=bool(relative), sample_std=False)


def _gaussian(std, dims):
    from monai.transforms import RandGaussianNoise

    return RandGaussianNoise(prob=1.0, mean=0.0, std=float(std), sample_std=False)


def _shift(offset, dims):
    from monai.transforms import ShiftIntensity

    return ShiftIntensity(offset=float(offset))


@dataclass(frozen=True)
class Kind:
    build: Callable  # (**params, dims) -> transform
    library: str  # "torchio" | "monai"
    geometric: bool = False  # moves the label with the image
    clip_negative: bool = False  # negatives to 0 afterwards (ROOD-MRI's ghosting and motion)
    per_channel: bool = False  # applied to each channel alone (its own intensity range)


KINDS: dict[str, Kind] = {
    "affine": Kind(_affine, "torchio", geometric=True),
    "elastic": Kind(_elastic, "torchio", geometric=True),
    "anisotropy": Kind(_anisotropy, "torchio"),
    "bias_field": Kind(_bias_field, "torchio"),
    "ghosting": Kind(_ghosting, "torchio", clip_negative=True),
    "motion": Kind(_motion, "torchio", clip_negative=True),
    "blur": Kind(_blur, "torchio"),
    "contrast": Kind(_contrast, "monai", per_channel=True),
    "rician_noise": Kind(_rician, "monai"),
    "gaussian_noise": Kind(_gaussian, "monai"),
    "shift": Kind(_shift, "monai"),
}


@dataclass
class Corruption:
    """One corruption at one level: ``corruption(case, seed)`` returns the corrupted case and what was drawn."""

    name: str
    kind: str
    level: int
    params: dict[str, Any]  # this level's values and the fixed ones

    @property
    def geometric(self) -> bool:
        return KINDS[self.kind].geometric

    def record(self) -> dict:
        k = KINDS[self.kind]
        return {"name": self.name, "kind": self.kind, "level": self.level, "params": dict(self.params),
                "library": k.library, "moves_label": k.geometric,
                **({"negatives_clipped": True} if k.clip_negative else {})}

    def transform(self, dims: int):
        return KINDS[self.kind].build(**self.params, dims=dims)

    def __call__(self, case: CaseData, seed: int) -> tuple[CaseData, dict]:
        dims = case.image.ndim - 1
        kind = KINDS[self.kind]
        if kind.geometric and case.raters is not None:
            raise ValueError(f"{case.case_id}: {self.name} moves the label, and moving several raters' maps "
                             "is not implemented; use an intensity corruption for a dataset with raters")
        transform = self.transform(dims)
        image = np.asarray(case.image, dtype=np.float32)
        label = case.label
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if kind.library == "monai":
                image, drawn = _apply_monai(transform, image, seed, kind.per_channel)
            else:
                image, moved, drawn = _apply_torchio(transform, image, label if kind.geometric else None,
                                                     case.spacing, case.affine, dims)
                if kind.geometric and label is not None:
                    label = moved.astype(np.asarray(label).dtype)
        if kind.clip_negative:
            image = np.maximum(image, 0, out=image)
        image = np.ascontiguousarray(image, dtype=np.float32)
        if not np.isfinite(image).all():
            raise ValueError(f"{case.case_id}: {self.name} level {self.level} made non-finite intensities")
        return replace(case, image=image, label=label, meta=dict(case.meta)), {"seed": seed, **drawn}


def corruption(name: str, spec: CorruptionSpec, level: int) -> Corruption:
    """The corruption ``name`` of a suite at ``level`` (1-based); unknown kinds or parameters are refused by name."""
    kind = spec.kind
    if kind not in KINDS:
        raise ConfigError(f"config key 'shift.definitions.{name}.kind'={kind!r}: expected one of {sorted(KINDS)}")
    params = {k: v[level - 1] for k, v in spec.levels.items()}
    params.update(spec.fixed)
    params = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in params.items()}
    import inspect

    accepted = set(inspect.signature(KINDS[kind].build).parameters) - {"dims"}
    required = {p for p, v in inspect.signature(KINDS[kind].build).parameters.items()
                if v.default is inspect.Parameter.empty and p != "dims"}
    if set(params) - accepted or required - set(params):
        raise ConfigError(f"config key 'shift.definitions.{name}': kind {kind} takes {sorted(accepted)} "
                          f"(required: {sorted(required)}), got {sorted(params)}")
    return Corruption(name, kind, int(level), params)


def _apply_monai(transform, image: np.ndarray, seed: int, per_channel: bool) -> tuple[np.ndarray, dict]:
    if hasattr(transform, "set_random_state"):
        transform.set_random_state(seed=seed)
    x = torch.from_numpy(image.copy())
    if per_channel:
        out = torch.stack([torch.as_tensor(transform(x[c:c + 1]))[0] for c in range(x.shape[0])])
    else:
        out = torch.as_tensor(transform(x))
    return out.detach().cpu().numpy().astype(np.float32), {}


def _tio_affine(spacing, affine, dims) -> np.ndarray:
    """The 4 x 4 affine TorchIO sees: the case's, or, for a 2D case, its in-plane spacing and 1 mm across."""
    if dims == 3 and affine is not None and np.asarray(affine).shape == (4, 4):
        return np.asarray(affine, dtype=np.float64)
    out = np.eye(4)
    out[0, 0], out[1, 1] = float(spacing[0]), float(spacing[1])
    return out


def _apply_torchio(transform, image: np.ndarray, label, spacing, affine, dims):
    tio = _tio()
    x = torch.from_numpy(image.copy() if dims == 3 else image[..., None].copy())
    a = _tio_affine(spacing, affine, dims)
    images = {"image": tio.ScalarImage(tensor=x, affine=a)}
    if label is not None:
        lab = np.asarray(label)
        lab = lab[None] if lab.ndim == dims else lab  # a class map, or R x *S region masks
        t = torch.from_numpy(np.ascontiguousarray(lab if dims == 3 else lab[..., None]).astype(np.int64))
        images["label"] = tio.LabelMap(tensor=t, affine=a)
    with warnings.catch_warnings():
        # TorchIO warns of possible folding whenever the maximum displacement exceeds its control-point grid:
        # a property of the severity on a small volume, recorded as the level's parameters
        warnings.filterwarnings("ignore", message="The maximum displacement is larger", category=RuntimeWarning)
        out = transform(tio.Subject(**images))
    drawn = _drawn(out)
    new = out["image"].data.numpy()
    new = new if dims == 3 else new[..., 0]
    moved = None
    if label is not None:
        m = out["label"].data.numpy()
        m = m if dims == 3 else m[..., 0]
        moved = np.rint(m).astype(np.int64)
        moved = moved[0] if np.asarray(label).ndim == dims else moved
    return new, moved, drawn


def _drawn(subject) -> dict:
    """The parameters TorchIO applied (small values as lists; large arrays by shape only)."""
    out = []
    for name, args in subject.applied_transforms:
        kept = {}
        for key, value in args.items():
            if key in ("include", "exclude", "copy", "label_keys", "keep", "parse_input"):
                continue
            kept[key] = _small(value)
        out.append({"transform": name, **kept})
    return {"applied": out}


def _small(value):
    if isinstance(value, dict):
        return {str(k): _small(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value.round(6).tolist() if value.size <= 64 else f"array{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return [_small(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)

"""Built-in phantoms: a cardiac-like 2D/3D task that needs no download.

Each case holds three touching structures around a random centre: a blood pool (class 3)
inside a ring (class 2), with a crescent (class 1) wrapped against one side of the ring,
like the LV, myocardium and RV of a short-axis cardiac slice. Shapes, sizes, orientations
and positions vary per case; the image is class intensities that overlap between classes,
a smooth multiplicative bias field, partial-volume blur and Rician-like noise. Thin
structures, blurred boundaries and overlapping intensities leave a network uncertain at
boundaries, which is what calibration studies need. Cases are a pure function of
``(seed, index)``, so every run sees the same data.
"""
from __future__ import annotations

import numpy as np

from mcseg.data.base import SegmentationDataset
from mcseg.data.cases import CaseData, CaseRef
from mcseg.data.fingerprint import combine

CLASS_NAMES = ("background", "crescent", "ring", "pool")
# Mean intensity per class: ring and background overlap strongly, crescent and pool less.
_CLASS_MEANS = np.array([0.25, 0.75, 0.4, 1.0], dtype=np.float32)


def _grid(shape: tuple[int, ...]) -> list[np.ndarray]:
    return np.meshgrid(*[np.arange(n, dtype=np.float32) for n in shape], indexing="ij")


def _rotation(rng: np.random.Generator, ndim: int) -> np.ndarray:
    if ndim == 2:
        t = rng.uniform(0, 2 * np.pi)
        return np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]], dtype=np.float32)
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def phantom(shape: tuple[int, ...], seed: int, index: int, noise: float = 0.18) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(image, label)`` for case ``index``: image float32 ``shape``, label int64 ``shape``."""
    from scipy.ndimage import gaussian_filter  # here: scipy.ndimage takes ~1 s to import (docs/benchmarks.md)

    rng = np.random.default_rng([seed, index])
    ndim = len(shape)
    size = np.asarray(shape, dtype=np.float32)
    coords = np.stack(_grid(shape), axis=-1)
    centre = size / 2 + rng.uniform(-0.12, 0.12, ndim) * size
    scale = float(min(shape)) * rng.uniform(0.6, 1.25)
    # Ellipsoidal distance in a randomly rotated frame.
    rot = _rotation(rng, ndim)
    local = (coords - centre) @ rot
    radii_pool = scale * rng.uniform(0.09, 0.16, ndim)
    r_pool = np.sqrt(((local / radii_pool) ** 2).sum(-1))
    wall = rng.uniform(0.35, 0.7)  # ring thickness relative to the pool radius
    # Wall thickness varies smoothly around the ring, as a myocardium does.
    wobble = 1 + 0.25 * gaussian_filter(rng.normal(size=shape).astype(np.float32), sigma=min(shape) / 8) * 8
    r_ring = r_pool / (1 + wall * np.clip(wobble, 0.4, 1.6))
    label = np.zeros(shape, dtype=np.int64)
    label[r_ring <= 1] = 2
    label[r_pool <= 1] = 3
    # Crescent: an offset ellipsoid hugging the ring on one side, outside the ring.
    direction = rng.normal(size=ndim).astype(np.float32)
    direction /= np.linalg.norm(direction)
    offset = direction * radii_pool.mean() * (1 + wall) * rng.uniform(0.8, 1.1)
    radii_cres = radii_pool * rng.uniform(1.2, 1.8, ndim)
    r_cres = np.sqrt((((local - offset) / radii_cres) ** 2).sum(-1))
    label[(r_cres <= 1) & (label == 0)] = 1
    # Image: class means with per-case jitter, blur, bias field and noise.
    means = _CLASS_MEANS + rng.normal(0, 0.04, len(_CLASS_MEANS)).astype(np.float32)
    image = means[label]
    image = gaussian_filter(image, sigma=rng.uniform(0.6, 1.4))
    bias = gaussian_filter(rng.normal(size=shape).astype(np.float32), sigma=min(shape) / 4)
    image = image * np.exp(0.25 * bias / (np.abs(bias).max() + 1e-6))
    image = np.sqrt((image + rng.normal(0, noise, shape)) ** 2 + rng.normal(0, noise, shape) ** 2)
    return image.astype(np.float32), label


class SyntheticDataset(SegmentationDataset):
    """``n_cases`` phantoms of ``shape`` (2D or 3D), generated on demand from ``seed``."""

    files_on_disk = False

    def __init__(
        self, name: str = "synthetic", shape: tuple[int, ...] = (96, 96), n_cases: int = 60, seed: int = 0,
        noise: float = 0.18, spacing: tuple[float, ...] | None = None, **kwargs
    ) -> None:
        shape = tuple(int(s) for s in shape)
        if len(shape) not in (2, 3) or min(shape) < 16:
            raise ValueError(f"dataset.shape={list(shape)}: expected 2 or 3 sizes, each >= 16")
        if n_cases < 3:
            raise ValueError(f"dataset.n_cases={n_cases}: need at least 3 (train, val, test)")
        kwargs.setdefault("num_classes", len(CLASS_NAMES))
        kwargs.setdefault("class_names", list(CLASS_NAMES))
        super().__init__(name=name, spatial_dims=len(shape), **kwargs)
        if not self.preprocess.identity:
            raise ValueError("dataset.preprocess: phantoms are generated on their final grid; leave preprocessing off")
        self._finalise_classes()
        self.shape, self.n_cases, self.seed, self.noise = shape, n_cases, seed, noise
        self.spacing = tuple(float(s) for s in (spacing or (1.0,) * len(shape)))

    def case_refs(self) -> list[CaseRef]:
        return [CaseRef(f"{self.name}_{i:03d}", (), None) for i in range(self.n_cases)]

    def content_fingerprint(self, ref: CaseRef, cache=None) -> str:
        """A phantom is what generates it: shape, seed, index and noise (not the case's name)."""
        index = int(ref.case_id.rsplit("_", 1)[1])
        return combine(["phantom", *map(str, self.shape), str(self.seed), str(index), repr(float(self.noise)),
                        *map(repr, self.spacing)])

    input_fingerprint = content_fingerprint  # a phantom's image and label come from the same generator

    def read(self, ref: CaseRef) -> CaseData:
        """The phantom as a scanner would give it (raw intensities); :meth:`load` normalises it, after a
        corruption when one is set (evaluation under shift)."""
        index = int(ref.case_id.rsplit("_", 1)[1])
        image, label = phantom(self.shape, self.seed, index, self.noise)
        affine = np.diag(list(self.spacing) + [1.0] * (4 - len(self.spacing)))
        return CaseData(ref.case_id, image[None], label, self.spacing, affine)

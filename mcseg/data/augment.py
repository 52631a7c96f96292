"""Spatial and intensity augmentation of training samples with MONAI transforms.

Every random draw comes from the sample's own ``numpy`` generator (seeded by
``(seed, epoch, index)`` in :class:`mcseg.data.sampling.PatchDataset`); MONAI's randomizable
transforms are re-seeded from it for each sample, so a sample stays a pure function of its
seed, epoch and index whatever the number of loader workers.

Rotation and scaling are applied to a region cut around the sample's centre that is just
large enough to hold the rotated, scaled patch, then resampled to the patch size by MONAI's
``Affine`` (images bilinear, labels nearest), so patches have no empty corners where the
volume continues.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class AugmentConfig:
    """The ``dataset.augment`` node (off by default)."""

    rotate_deg: float = 0.0  # maximum rotation angle, degrees, drawn uniformly in [-a, a]
    rotate_axes: list[int] | None = None  # 3D: axes rotated about (null: all three); 2D: in-plane
    scale: list[float] | None = None  # [min, max] zoom factor (> 1 enlarges), isotropic
    spatial_prob: float = 0.2  # probability of rotating, and (independently) of scaling a sample
    gamma: list[float] | None = None  # [min, max] gamma of MONAI's RandAdjustContrast
    noise_std: float = 0.0  # maximum standard deviation of MONAI's RandGaussianNoise
    intensity_prob: float = 0.15  # probability of each intensity transform

    @property
    def active(self) -> bool:
        return self.rotate_deg > 0 or self.scale is not None or self.gamma is not None or self.noise_std > 0


def augment_config(node: Mapping | AugmentConfig | None) -> AugmentConfig | None:
    """Check a ``dataset.augment`` node (``None`` or all-off gives ``None``); errors name the key."""
    if node is None:
        return None
    from mcseg.config import typed

    cfg = node if isinstance(node, AugmentConfig) else typed(node, AugmentConfig, "dataset.augment")
    if not 0 <= cfg.rotate_deg <= 180:
        raise ValueError(f"dataset.augment.rotate_deg={cfg.rotate_deg}: expected an angle in [0, 180]")
    if cfg.rotate_axes is not None and any(a not in (0, 1, 2) for a in cfg.rotate_axes):
        raise ValueError(f"dataset.augment.rotate_axes={cfg.rotate_axes}: expected axes among 0, 1, 2")
    for key in ("scale", "gamma"):
        value = getattr(cfg, key)
        if value is not None and (len(value) != 2 or not 0 < value[0] <= value[1]):
            raise ValueError(f"dataset.augment.{key}={list(value)}: expected [min, max] with 0 < min <= max")
    for key in ("spatial_prob", "intensity_prob"):
        if not 0 <= getattr(cfg, key) <= 1:
            raise ValueError(f"dataset.augment.{key}={getattr(cfg, key)}: expected a probability in [0, 1]")
    if cfg.noise_std < 0:
        raise ValueError(f"dataset.augment.noise_std={cfg.noise_std}: expected >= 0")
    return cfg if cfg.active else None


class Augmenter:
    """Draws and applies one sample's augmentation for ``dims``-D samples."""

    def __init__(self, cfg: AugmentConfig, dims: int) -> None:
        self.cfg, self.dims = cfg, dims

    def draw_spatial(self, rng: np.random.Generator) -> tuple[list[float] | None, float | None]:
        """Rotation angles (radians, MONAI's order) and a zoom factor, or ``None`` for each."""
        cfg, angles, zoom = self.cfg, None, None
        if cfg.rotate_deg > 0 and rng.random() < cfg.spatial_prob:
            limit = math.radians(cfg.rotate_deg)
            if self.dims == 2:
                angles = [float(rng.uniform(-limit, limit))]
            else:
                axes = cfg.rotate_axes if cfg.rotate_axes is not None else (0, 1, 2)
                angles = [float(rng.uniform(-limit, limit)) if a in axes else 0.0 for a in range(3)]
        if cfg.scale is not None and rng.random() < cfg.spatial_prob:
            zoom = float(rng.uniform(cfg.scale[0], cfg.scale[1]))
        return angles, zoom

    def _matrix(self, angles: list[float] | None, zoom: float | None) -> np.ndarray:
        """Output-voxel offsets to input-voxel offsets, as MONAI's ``Affine`` builds it."""
        from monai.transforms.utils import create_rotate

        m = np.eye(self.dims)
        if angles is not None:
            m = np.asarray(create_rotate(self.dims, angles))[: self.dims, : self.dims] @ m
        if zoom is not None:
            m = m / zoom
        return m

    def source_size(self, patch: Sequence[int], angles, zoom) -> list[int]:
        """Size of the region that holds the transformed patch (same parity as the patch, so centres agree)."""
        m = np.abs(self._matrix(angles, zoom))
        need = m @ np.asarray(patch, dtype=np.float64)
        sizes = []
        for n, p in zip(need, patch):
            q = int(math.ceil(n)) + 2
            q += (q - p) % 2
            sizes.append(q)
        return sizes

    def warp(self, image, label, patch: Sequence[int], angles, zoom, label_has_channels: bool):
        """Rotate/scale the centred region to ``patch`` (image bilinear, label nearest, in the label's type); numpy
        arrays in, numpy arrays out, or torch tensors in and out (on their device)."""
        import torch
        from monai.transforms import Affine

        kwargs = dict(rotate_params=angles, scale_params=None if zoom is None else [1.0 / zoom] * self.dims,
                      spatial_size=list(patch), padding_mode="zeros", image_only=True)
        img = Affine(mode="bilinear", **kwargs)(_float_tensor(image))
        lab = Affine(mode="nearest", **kwargs)(_float_tensor(label if label_has_channels else label[None]))
        lab = lab if label_has_channels else lab[0]
        # nearest-neighbour values are the label's own values (or 0): its type holds them, so a warped sample's
        # label travels as compactly as an unwarped one (and every sample of a batch has one type)
        if isinstance(label, np.ndarray):
            return np.asarray(img, dtype=np.float32), np.rint(np.asarray(lab)).astype(label.dtype)
        return _plain(img), torch.round(_plain(lab)).to(label.dtype)

    def draw_intensity(self, rng: np.random.Generator) -> tuple[int | None, int | None]:
        """Seeds of MONAI's RandAdjustContrast (gamma) and RandGaussianNoise for one sample, ``None`` for each
        transform not applied to it."""
        cfg, gamma, noise = self.cfg, None, None
        if cfg.gamma is not None and rng.random() < cfg.intensity_prob:
            gamma = int(rng.integers(2**31))
        if cfg.noise_std > 0 and rng.random() < cfg.intensity_prob:
            noise = int(rng.integers(2**31))
        return gamma, noise

    def intensity(self, image, gamma_seed: int | None, noise_seed: int | None):
        """The drawn gamma and noise (:meth:`draw_intensity`) applied to ``image`` (numpy in and out, or torch)."""
        from monai.transforms import RandAdjustContrast, RandGaussianNoise

        if gamma_seed is None and noise_seed is None:
            return image
        out = _float_tensor(image)
        if gamma_seed is not None:
            t = RandAdjustContrast(prob=1.0, gamma=tuple(self.cfg.gamma))
            t.set_random_state(seed=gamma_seed)
            out = _plain(t(out))
        if noise_seed is not None:
            t = RandGaussianNoise(prob=1.0, std=self.cfg.noise_std)
            t.set_random_state(seed=noise_seed)
            out = _plain(t(out))
        return np.asarray(out, dtype=np.float32) if isinstance(image, np.ndarray) else out


def _float_tensor(array):
    """``array`` (numpy or torch) as a float32 torch tensor, sharing memory where it can."""
    import torch

    if isinstance(array, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    return array.to(torch.float32)


def _plain(tensor):
    """A MONAI output as a plain torch tensor (its MetaTensor's data, no copy)."""
    return tensor.as_tensor() if hasattr(tensor, "as_tensor") else tensor

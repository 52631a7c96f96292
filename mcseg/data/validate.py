"""The checks a case's files pass before a run uses them, written once.

``mcseg-data check`` (every voxel read), the start of training (every case of every split)
and ``evaluate`` (the split it scores) apply the same rules through :func:`inspect_case`:
every file readable, channels and label on one voxel grid (shape always; affine up to
``dataset.geometry_tolerance`` mm, as ``dataset.geometry_check`` says: ``error``, ``warn``
or ``off``), as many channels as ``dataset.in_channels``. At start only headers are read
(:func:`~mcseg.data.io.read_header`: the 208 cases of MSD hippocampus in about half a
second), so a broken file anywhere ends the run before its first training step; label
values need the voxels and are checked when a case is loaded.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcseg.data.cases import CaseRef
from mcseg.data.io import VolumeError, read_header
from mcseg.text import plural

log = logging.getLogger(__name__)

GEOMETRY_CHECKS = ("error", "warn", "off")
GEOMETRY_TOLERANCE_MM = 1e-3  # header rounding; a real mismatch (a shifted origin, a wrong spacing) is mm
_RELATIVE_TOLERANCE = 1e-4  # float32 headers round large coordinates


@dataclass(frozen=True)
class GeometryRule:
    """How channels and label of a case must agree in world space (``dataset.geometry_*``)."""

    check: str = "error"
    tolerance: float = GEOMETRY_TOLERANCE_MM

    def __post_init__(self) -> None:
        if self.check not in GEOMETRY_CHECKS:
            raise ValueError(f"dataset.geometry_check={self.check!r}: expected one of {', '.join(GEOMETRY_CHECKS)}")
        if not (isinstance(self.tolerance, (int, float)) and np.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"dataset.geometry_tolerance={self.tolerance!r}: expected a distance in mm >= 0")

    def difference(self, a: np.ndarray, b: np.ndarray) -> float | None:
        """The largest difference (mm) between two voxel-to-world affines when it is beyond the
        tolerance, else ``None``."""
        a, b = np.asarray(a, dtype=np.float64)[:3], np.asarray(b, dtype=np.float64)[:3]
        if np.allclose(a, b, rtol=_RELATIVE_TOLERANCE, atol=self.tolerance):
            return None
        return float(np.abs(a - b).max())


@dataclass
class CaseFindings:
    """What :func:`inspect_case` found: problems, and the volumes (or headers) it read."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    images: list[tuple[Path, object]] = field(default_factory=list)  # (path, Volume or VolumeHeader)
    label: object | None = None
    raters: list = field(default_factory=list)  # one Volume/VolumeHeader (None when unreadable) per rater
    channels: int = 0


def inspect_case(dataset, ref: CaseRef, read: Callable = read_header) -> CaseFindings:
    """Read every file of ``ref`` with ``read`` (:func:`read_header` or ``read_volume``) and
    collect what breaks the dataset's rules (never raises for bad data)."""
    found = CaseFindings()
    dims = dataset.spatial_dims
    rule: GeometryRule = getattr(dataset, "geometry", GeometryRule())
    first = None
    for path in ref.image_paths:
        try:
            vol = read(path, dims)
        except VolumeError as exc:
            found.errors.append(f"image: {exc}")
            continue
        found.images.append((path, vol))
        found.channels += 1 if len(vol.shape) == dims else int(np.prod(vol.shape[dims:]))
        if first is None:
            first = (path, vol)
        elif vol.spatial_shape != first[1].spatial_shape:
            found.errors.append(f"{path}: channel shape {vol.spatial_shape} does not match "
                                f"{first[0].name} shape {first[1].spatial_shape}")
        else:
            _compare_affines(found, rule, path, vol, first, "affine")
    if not ref.image_paths:
        found.errors.append(f"case {ref.case_id}: no image files")
    expected = getattr(dataset, "in_channels", None)
    if expected is not None and found.channels and not found.errors and found.channels != expected:
        found.errors.append(f"{ref.image_paths[0]}: {found.channels} channels, dataset.in_channels={expected}")
    if not ref.labelled:
        found.errors.append(f"case {ref.case_id}: no label file")
        return found
    if ref.label_path is not None:
        found.label = _inspect_label(found, rule, read, dims, ref.label_path, "", first, "label")
    for r, path in enumerate(ref.raters):  # each rater's map passes the label's rules, named by case and rater
        found.raters.append(_inspect_label(found, rule, read, dims, path, ref.rater_tag(r), first, "rater label"))
    return found


def _inspect_label(found: CaseFindings, rule: GeometryRule, read: Callable, dims: int, path: Path, tag: str,
                   first, what: str):
    """Read one label file (the label, or a rater's with ``tag`` naming case and rater) and check it lies on
    the image grid; ``None`` if it does not."""
    source = f"{path}{tag}"
    try:
        lab = read(path, dims)
    except VolumeError as exc:
        found.errors.append(f"{what}: {exc}{tag}")
        return None
    if first is not None:
        if lab.spatial_shape != first[1].spatial_shape or len(lab.shape) != dims:
            found.errors.append(f"{source}: {what} shape {tuple(lab.shape)} does not match image shape "
                                f"{first[1].spatial_shape} of {first[0]}")
            return None
        _compare_affines(found, rule, source, lab, first, f"{what} affine")
    return lab


def _compare_affines(found: CaseFindings, rule: GeometryRule, path: Path, vol, first, what: str) -> None:
    if rule.check == "off":
        return
    diff = rule.difference(vol.affine, first[1].affine)
    if diff is None:
        return
    message = (f"{path}: {what} differs from that of {first[0].name} by up to {diff:.4g} mm "
               f"(dataset.geometry_tolerance={rule.tolerance:g} mm; dataset.geometry_check=warn or off "
               f"accepts it)")
    (found.errors if rule.check == "error" else found.warnings).append(message)


def validate_cases(dataset, refs: Sequence[CaseRef], what: str = "the run") -> None:
    """Check the headers of every case of ``refs`` before ``what`` uses them.

    Raises :class:`VolumeError` with one line naming the first bad file and how many other
    cases are bad; logs geometry warnings (``dataset.geometry_check=warn``). A no-op for
    datasets generated in memory (``dataset.files_on_disk`` false).
    """
    if not getattr(dataset, "files_on_disk", True):
        return
    bad, warned = [], []
    for ref in refs:
        found = inspect_case(dataset, ref)
        if found.errors:
            bad.append((ref, found.errors[0]))
        elif found.warnings:
            warned.append((ref, found.warnings[0]))
    if warned:
        more = f" (and {plural(len(warned) - 1, 'more case')})" if len(warned) > 1 else ""
        log.warning("%s: %s%s", warned[0][0].case_id, warned[0][1], more)
    if bad:
        more = f"; {plural(len(bad) - 1, 'more case')} with errors, `mcseg-data check` lists them" \
            if len(bad) > 1 else ""
        raise VolumeError(f"{bad[0][1]} (case {bad[0][0].case_id}, checked before {what}){more}")


"""Reading and writing medical volumes with their geometry.

Every reader returns the array in the file's own voxel order together with the voxel
spacing (mm) and the 4x4 voxel-to-world affine, so that predictions can be written back
exactly where the input was. NIfTI goes through nibabel; other formats SimpleITK reads
(``.mha``, ``.nrrd``, ``.mhd``) go through SimpleITK.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class VolumeError(ValueError):
    """A volume file is missing, unreadable or inconsistent; the message names the file."""


@dataclass
class Volume:
    """An array in file voxel order (X, Y[, Z][, C]) with spacing (mm) and affine."""

    array: np.ndarray
    spacing: tuple[float, ...]
    affine: np.ndarray

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape[: len(self.spacing)])


_NIFTI = (".nii", ".nii.gz")


def _is_nifti(path: Path) -> bool:
    return path.name.endswith(_NIFTI)


def read_volume(path: str | os.PathLike, spatial_dims: int | None = None) -> Volume:
    """Read a volume; ``spatial_dims`` (2 or 3) says how many leading axes are spatial.

    By default a 4D file is taken as 3 spatial axes plus channels (MSD's multi-modal layout).
    Raises :class:`VolumeError` naming the file for a missing, truncated or corrupt file.
    """
    path = Path(path)
    if not path.is_file():
        raise VolumeError(f"{path}: file not found")
    try:
        if _is_nifti(path):
            import nibabel as nib

            img = nib.load(str(path))
            array = np.asarray(img.dataobj)
            affine = np.asarray(img.affine, dtype=np.float64)
            zooms = tuple(float(z) for z in img.header.get_zooms())
        else:
            import SimpleITK as sitk

            img = sitk.ReadImage(str(path))
            # SimpleITK arrays are (Z, Y, X[, C]); transpose to file voxel order (X, Y, Z[, C]).
            array = sitk.GetArrayFromImage(img)
            sdim = img.GetDimension()
            array = np.transpose(array, tuple(range(sdim - 1, -1, -1)) + tuple(range(sdim, array.ndim)))
            zooms = tuple(float(s) for s in img.GetSpacing())
            direction = np.asarray(img.GetDirection(), dtype=np.float64).reshape(sdim, sdim)
            affine = np.eye(4)
            affine[:sdim, :sdim] = direction * np.asarray(zooms)[None, :]
            affine[:sdim, 3] = img.GetOrigin()
            # ITK is LPS, NIfTI affines are RAS.
            affine[:2] *= -1
    except VolumeError:
        raise
    except Exception as exc:  # nibabel/zlib/ITK raise many types for corrupt files
        raise VolumeError(f"{path}: cannot read volume ({type(exc).__name__}: {exc})") from exc
    if spatial_dims is None:
        spatial_dims = min(array.ndim, 3)
    if array.ndim < spatial_dims:
        raise VolumeError(f"{path}: expected at least {spatial_dims} dimensions, got shape {array.shape}")
    spacing = tuple(zooms[:spatial_dims]) if len(zooms) >= spatial_dims else (1.0,) * spatial_dims
    if not all(np.isfinite(s) and s > 0 for s in spacing):
        raise VolumeError(f"{path}: invalid voxel spacing {spacing}")
    return Volume(array=array, spacing=spacing, affine=affine)


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: Path, write_fn) -> None:
    """Call ``write_fn(tmp_path)`` then rename onto ``path`` so readers never see a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = "".join(path.suffixes)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=suffix)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files: results must stay readable like any other file
    try:
        write_fn(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_nifti(path: str | os.PathLike, array: np.ndarray, affine: np.ndarray) -> None:
    """Write ``array`` (voxel order as read) with ``affine`` to a NIfTI file, atomically."""
    import nibabel as nib

    img = nib.Nifti1Image(np.asarray(array), np.asarray(affine, dtype=np.float64))
    atomic_write(Path(path), lambda tmp: nib.save(img, str(tmp)))


def write_json(path: Path, payload) -> None:
    """Write ``payload`` as indented JSON through :func:`atomic_write`."""
    atomic_write(Path(path), lambda tmp: tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n"))

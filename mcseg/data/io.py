"""Reading and writing medical volumes with their geometry.

Every reader returns the array in the file's own voxel order together with the voxel
spacing (mm) and the 4x4 voxel-to-world affine, so that predictions can be written back
exactly where the input was. NIfTI goes through nibabel; other formats SimpleITK reads
(``.mha``, ``.nrrd``, ``.mhd``) go through SimpleITK.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcseg.files import atomic_write


class VolumeError(ValueError):
    """A volume file is missing, unreadable or inconsistent; the message names the file."""


@dataclass
class Volume:
    """An array in file voxel order (X, Y[, Z][, C]) with spacing (mm) and affine."""

    array: np.ndarray
    spacing: tuple[float, ...]
    affine: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape[: len(self.spacing)])


@dataclass
class VolumeHeader:
    """What a file's header says, without its voxels: full array shape, spacing (mm), affine."""

    shape: tuple[int, ...]
    spacing: tuple[float, ...]
    affine: np.ndarray

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[: len(self.spacing)])


_NIFTI = (".nii", ".nii.gz")


def _is_nifti(path: Path) -> bool:
    return path.name.endswith(_NIFTI)


def itk_geometry(img) -> tuple[tuple[float, ...], np.ndarray]:
    """Spacing and RAS affine of a SimpleITK image or ImageFileReader (same getters)."""
    sdim = img.GetDimension()
    zooms = tuple(float(s) for s in img.GetSpacing())
    direction = np.asarray(img.GetDirection(), dtype=np.float64).reshape(sdim, sdim)
    affine = np.eye(4)
    affine[:sdim, :sdim] = direction * np.asarray(zooms)[None, :]
    affine[:sdim, 3] = img.GetOrigin()
    affine[:2] *= -1  # ITK is LPS, NIfTI affines are RAS.
    return zooms, affine


def _spatial(path: Path, shape: tuple[int, ...], zooms: tuple[float, ...],
             spatial_dims: int | None) -> tuple[float, ...]:
    """The spacing of the ``spatial_dims`` leading axes; raises for too few axes or a bad spacing."""
    if spatial_dims is None:
        spatial_dims = min(len(shape), 3)
    if len(shape) < spatial_dims:
        raise VolumeError(f"{path}: expected at least {spatial_dims} dimensions, got shape {tuple(shape)}")
    spacing = tuple(zooms[:spatial_dims]) if len(zooms) >= spatial_dims else (1.0,) * spatial_dims
    if not all(np.isfinite(s) and s > 0 for s in spacing):
        raise VolumeError(f"{path}: invalid voxel spacing {spacing}")
    return spacing


@contextmanager
def _reading(path: Path):
    """Turn a missing file and any reader's failure into one :class:`VolumeError` naming ``path``
    (nibabel, zlib and ITK raise many types for corrupt files)."""
    if not path.is_file():
        raise VolumeError(f"{path}: file not found")
    try:
        yield
    except VolumeError:
        raise
    except Exception as exc:
        raise VolumeError(f"{path}: cannot read volume ({type(exc).__name__}: {exc})") from exc


def read_volume(path: str | os.PathLike, spatial_dims: int | None = None) -> Volume:
    """Read a volume; ``spatial_dims`` (2 or 3) says how many leading axes are spatial.

    By default a 4D file is taken as 3 spatial axes plus channels (MSD's multi-modal layout).
    Raises :class:`VolumeError` naming the file for a missing, truncated or corrupt file.
    """
    path = Path(path)
    with _reading(path):
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
            zooms, affine = itk_geometry(img)
    if _one_slice(array.shape, spatial_dims):
        array, zooms = array[:, :, 0], zooms[:2] + zooms[3:]
    return Volume(array=array, spacing=_spatial(path, array.shape, zooms, spatial_dims), affine=affine)


def _one_slice(shape: tuple[int, ...], spatial_dims: int | None) -> bool:
    """A 2D image stored as the single slice of a volume (``H x W x 1 [x C]``, as QUBIQ's NIfTI files are):
    read as ``H x W [x C]``. Either reading of ``H x W x 1`` gives one channel, so this is never ambiguous."""
    return spatial_dims == 2 and len(shape) >= 3 and shape[2] == 1


def read_header(path: str | os.PathLike, spatial_dims: int | None = None) -> VolumeHeader:
    """Shape, spacing and affine of a volume from its header alone (milliseconds per file).

    A gzipped NIfTI whose gzip trailer disagrees with the size its header promises (a truncated
    download or copy) is decompressed to be sure, so truncation is found here too; other damage
    inside the compressed data only shows when the voxels are read. Raises :class:`VolumeError`
    naming the file, as :func:`read_volume` does.
    """
    path = Path(path)
    with _reading(path):
        if _is_nifti(path):
            import nibabel as nib

            img = nib.load(str(path))
            shape = tuple(int(n) for n in img.shape)
            affine = np.asarray(img.affine, dtype=np.float64)
            zooms = tuple(float(z) for z in img.header.get_zooms())
            if not _nifti_size_plausible(path, img):
                np.asarray(img.dataobj)  # raises for a truncated file; a multi-member gzip just costs a read
        else:
            import SimpleITK as sitk

            reader = sitk.ImageFileReader()
            reader.SetFileName(str(path))
            reader.ReadImageInformation()
            sdim = reader.GetDimension()
            components = reader.GetNumberOfComponents()
            shape = tuple(int(n) for n in reader.GetSize()) + ((components,) if components > 1 else ())
            zooms, affine = itk_geometry(reader)
            if sdim != len(zooms):
                raise VolumeError(f"{path}: header dimension {sdim} but {len(zooms)} spacings")
    if _one_slice(shape, spatial_dims):
        shape, zooms = shape[:2] + shape[3:], zooms[:2] + zooms[3:]
    return VolumeHeader(shape=shape, spacing=_spatial(path, shape, zooms, spatial_dims), affine=affine)


def _nifti_size_plausible(path: Path, img) -> bool:
    """Whether the file holds the bytes its header declares (gzip: the trailer's size equals them)."""
    proxy = img.dataobj  # its offset is where nibabel reads voxels (the header's vox_offset may say 0)
    needed = int(proxy.offset) + int(np.prod(proxy.shape, dtype=np.int64)) * np.dtype(proxy.dtype).itemsize
    size = path.stat().st_size
    if not path.name.endswith(".gz"):
        return size >= needed
    if size < 18:  # shorter than a gzip header and trailer
        return False
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")  # uncompressed size modulo 2**32 (RFC 1952)
    return isize == needed % 2**32  # a truncated file ends in compressed data, not in this size


def write_nifti(path: str | os.PathLike, array: np.ndarray, affine: np.ndarray,
                reference: str | os.PathLike | None = None) -> None:
    """Write ``array`` (voxel order as read) with ``affine`` to a NIfTI file, atomically.

    ``reference``: the input volume the array belongs to; when it is a NIfTI file with this
    ``affine``, its qform and sform (matrices and codes) and its units are copied, so viewers
    place the output exactly where they place the input. Otherwise both forms are ``affine``
    with code 1 (scanner) and units mm/s.
    """
    import nibabel as nib

    affine = np.asarray(affine, dtype=np.float64)
    img = nib.Nifti1Image(np.asarray(array), affine)
    header = img.header
    ref = nib.load(str(reference)).header if reference is not None and _is_nifti(Path(reference)) else None
    if ref is not None and np.allclose(ref.get_best_affine(), affine, rtol=1e-5, atol=1e-4):
        header.set_qform(ref.get_qform(), code=int(ref["qform_code"]))
        header.set_sform(ref.get_sform(), code=int(ref["sform_code"]))
        header.set_xyzt_units(*ref.get_xyzt_units())
    else:
        header.set_qform(affine, code=1)
        header.set_sform(affine, code=1)
        header.set_xyzt_units("mm", "sec")
    atomic_write(Path(path), lambda tmp: nib.save(img, str(tmp)))

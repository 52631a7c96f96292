"""Smooth ECE (Blasiok & Nakkiran, "Smooth ECE: principled reliability diagrams via kernel smoothing",
ICLR 2024), computed from streamed sums so that per-case and pooled values come from one pass.

Definition, as relplot 1.0.3 (``relplot.smECE``, the authors' package) computes it for confidences f in [0, 1]
and outcomes y in {0, 1} (top-label: f = max_k p_k, y = 1[argmax = label]):

* For a bandwidth sigma, the E = floor(max(2000, round(20 / sigma)) / 2) + 1 nodes i / (E - 1) of [0, 1] receive
  every point split linearly between its two neighbouring nodes (weights 1 - frac and frac, frac = f (E - 1) - i,
  i = floor(f (E - 1)) clamped to [0, E - 2]), once with the weight r = f - y and once with the weight 1.
* Both node arrays are reflected about 0 and 1 and convolved with a Gaussian density of standard deviation sigma
  sampled on the node grid over offsets [-1/2, 1/2] (not normalised), then interpolated linearly at
  T = max(round(10 / sigma), 200) equispaced points t of [0, 1]:

      smECE_sigma = sum_t |(K * r)(t)| / sum_t ((K * 1)(t) + 1e-4).

* smECE = smECE_sigma at the bandwidth found by relplot's bisection for the fixed point sigma = smECE_sigma: ten
  halvings of [0, 1], keeping the end where sigma >= max(smECE_sigma, 0.001) is false; the result is the value at
  that end (a multiple of 2^-10, at least 2^-9; ``smooth_ece(..., return_width=True)`` also returns it).

Streaming (why mcseg has its own code: relplot needs every confidence in memory, about 22 passes over them; a 3D
split has 10^8 voxels). The points enter only through the node arrays, and within a cell of a fine grid that
lies inside one node interval those are linear in five sums per cell: the count n, the number correct n1, and the
sums of f, of f over the correct points, and of f^2 (sum frac = (E - 1) sum f - i n, sum frac f = (E - 1) sum f^2 -
i sum f). :class:`SmoothSums` keeps them over 2^20 equal cells of [0, 1] (40 MB of float64); a cell that straddles
a node boundary is assigned by its mean confidence, the only approximation. Measured against relplot on the same
(float64) confidences: differences below 1e-9 (tests/metrics/test_smooth_sums.py); a cell of identical
confidences (the common case: float32 voxels at 1.0) is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

__all__ = ["N_CELLS", "SmoothSums", "smooth_sums", "smooth_ece_sigma", "smooth_ece"]

N_CELLS = 2**20
_DENSITY_EPS = 1e-4  # relplot's constant added to the smoothed density (in units of points)
_MIN_SIGMA = 0.001  # relplot's eps of smECE: below it the bisection stops shrinking the bandwidth
_HALVINGS = 10  # relplot's refine


@dataclass(frozen=True)
class SmoothSums:
    """Per-cell sums over ``N_CELLS`` equal cells of the confidence, float64: ``count``, ``correct`` (number
    correct), ``conf`` (sum of f), ``conf_correct`` (sum of f over the correct points), ``conf_sq`` (sum of f^2).

    ``cells`` (ascending int64) names the cells the sums are of, a sparse form: one case's voxels occupy few of
    the 2^20 cells, so its sums take kilobytes instead of 40 MB (and a worker process returns them cheaply);
    ``None``: every cell, in order (dense). Both forms give the same values to the last bit: a cell's sum is the
    same additions in the same order, and a cell absent from one side of ``+`` adds an exact 0."""

    count: torch.Tensor
    correct: torch.Tensor
    conf: torch.Tensor
    conf_correct: torch.Tensor
    conf_sq: torch.Tensor
    cells: torch.Tensor | None = None

    SUMS = ("count", "correct", "conf", "conf_correct", "conf_sq")

    @classmethod
    def zeros(cls, device: torch.device | str | None = None) -> SmoothSums:
        return cls(*(torch.zeros(N_CELLS, dtype=torch.float64, device=device) for _ in cls.SUMS))

    def dense(self) -> SmoothSums:
        """The same sums over every cell."""
        if self.cells is None:
            return self
        out = SmoothSums.zeros(device=self.count.device)
        for name in self.SUMS:
            getattr(out, name).index_copy_(0, self.cells, getattr(self, name))
        return out

    def __add__(self, other: SmoothSums) -> SmoothSums:
        if self.cells is not None and other.cells is not None:
            cells = torch.unique(torch.cat([self.cells, other.cells]))  # ascending
            if cells.numel() <= _SPARSE_CELLS:
                out = SmoothSums(*(torch.zeros(cells.numel(), dtype=torch.float64, device=cells.device)
                                   for _ in self.SUMS), cells=cells)
                for part in (self, other):
                    out._add_into(part, torch.searchsorted(cells, part.cells))
                return out
            base, part = self.dense(), other  # too many cells together: dense
        elif self.cells is None and other.cells is None:
            return SmoothSums(*(getattr(self, name) + getattr(other, name) for name in self.SUMS))
        else:
            base, part = (self, other) if self.cells is None else (other, self)
        out = SmoothSums(*(getattr(base, name).clone() for name in self.SUMS))
        return out._add_into(part, part.cells)

    def __iadd__(self, other: SmoothSums) -> SmoothSums:
        """``self + other``, added into this side's own tensors where it is dense: a pooled sum over cases
        (always dense once its cells outgrow the sparse form, a fresh tensor of ``+`` that no one else holds) is
        not copied, 40 MB, for every case added; the same values to the last bit as ``+`` (each cell's additions
        in the same order). A sparse side: ``+``, a new object."""
        if self.cells is not None:
            return self + other
        if other.cells is None:
            for name in self.SUMS:
                getattr(self, name).add_(getattr(other, name))
            return self
        return self._add_into(other, other.cells)

    def _add_into(self, part: SmoothSums, slots: torch.Tensor) -> SmoothSums:
        for name in self.SUMS:
            getattr(self, name).index_add_(0, slots, getattr(part, name))
        return self

    @property
    def n_points(self) -> int:
        return int(self.count.sum().item())


# voxels per step of the accumulation: the float64 temporaries of a step stay small (a 3D case has 10^7 voxels)
_CHUNK = 1 << 18
# sums over at most this many cells stay sparse when added (beyond, the dense 2^20 cells are as cheap)
_SPARSE_CELLS = N_CELLS // 16


def smooth_sums(confidence: torch.Tensor, correct: torch.Tensor, into: SmoothSums | None = None) -> SmoothSums:
    """The :class:`SmoothSums` of confidences in [0, 1] (clamped) and 0/1 (or boolean) outcomes of the same
    shape, on their device, in the sparse form (the occupied cells); ``into + `` them when ``into`` is given."""
    if confidence.shape != correct.shape:
        raise ValueError(f"confidence and correct: expected the same shape, got {tuple(confidence.shape)} and "
                         f"{tuple(correct.shape)}")
    conf, hit = confidence.reshape(-1), correct.reshape(-1)
    if conf.device.type == "cpu" and conf.numel() <= _CHUNK:
        sums = _one_step_sums(conf, hit)
        return sums if into is None else into + sums
    steps = range(0, conf.numel(), _CHUNK)

    def chunk(start: int) -> tuple[torch.Tensor, torch.Tensor]:
        f = conf[start:start + _CHUNK].to(torch.float64).clamp(0.0, 1.0)
        return f, (f * N_CELLS).long().clamp_(max=N_CELLS - 1)

    # the occupied cells marked step by step: memory bounded by the 2^20 cells, not the voxels
    used = torch.zeros(N_CELLS, dtype=torch.bool, device=conf.device)
    for start in steps:
        used[_cells(conf[start:start + _CHUNK])] = True
    cells = used.nonzero()[:, 0]
    slot = torch.empty(N_CELLS, dtype=torch.long, device=conf.device)
    slot[cells] = torch.arange(cells.numel(), device=conf.device)
    sums = SmoothSums(*(torch.zeros(cells.numel(), dtype=torch.float64, device=conf.device)
                        for _ in SmoothSums.SUMS), cells=cells)
    for start in steps:  # per cell, the additions of the dense accumulation, in the same (voxel) order
        f, cell = chunk(start)
        y = hit[start:start + _CHUNK].to(torch.float64)
        index = slot[cell]
        sums.count.index_add_(0, index, torch.ones_like(f))
        sums.correct.index_add_(0, index, y)
        sums.conf.index_add_(0, index, f)
        sums.conf_correct.index_add_(0, index, f * y)
        sums.conf_sq.index_add_(0, index, f * f)
    return sums if into is None else into + sums


def _cells(confidence: torch.Tensor) -> torch.Tensor:
    """The cell floor(f * 2^20) of each confidence f clamped to [0, 1] (the last cell also holds 1), computed in
    the confidences' own float32 or float64: f and f * 2^20 are exact in either (a power of two), so the cells are
    those of the float64 values without a float64 copy."""
    f = confidence if confidence.dtype in (torch.float32, torch.float64) else confidence.to(torch.float32)
    return (f.clamp(0.0, 1.0) * N_CELLS).long().clamp_(max=N_CELLS - 1)


def _one_step_sums(conf: torch.Tensor, hit: torch.Tensor) -> SmoothSums:
    """:func:`smooth_sums` of at most one step of CPU voxels, in NumPy: the occupied cells marked in a bitmap (not
    sorted), each voxel's slot looked up, each sum one ``bincount``. A bincount adds the weights of a slot in
    voxel order, as ``index_add_`` does: the same sums to the last bit, in a third of the time on a small case."""
    f = conf.detach().to(torch.float64).clamp(0.0, 1.0).numpy()
    cell = np.minimum((f * N_CELLS).astype(np.int64), N_CELLS - 1)
    used = np.zeros(N_CELLS, dtype=bool)
    used[cell] = True
    cells = np.flatnonzero(used)
    lookup = np.empty(N_CELLS, dtype=np.intp)
    lookup[cells] = np.arange(cells.size)
    slot, n = lookup[cell], cells.size
    y = hit.detach().numpy().astype(np.float64)
    sums = (np.bincount(slot, minlength=n).astype(np.float64), np.bincount(slot, y, n), np.bincount(slot, f, n),
            np.bincount(slot, f * y, n), np.bincount(slot, f * f, n))
    return SmoothSums(*(torch.from_numpy(s) for s in sums), cells=torch.from_numpy(cells))


def _occupied(sums: SmoothSums) -> dict[str, np.ndarray]:
    keep = sums.count > 0
    if bool(keep.all()):  # every cell of a case's (sparse) sums: no copies
        return {name: getattr(sums, name).cpu().numpy() for name in sums.SUMS}
    return {name: getattr(sums, name)[keep].cpu().numpy() for name in sums.SUMS}


def _node_arrays(cells: dict[str, np.ndarray], n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights of r = f - y and of 1 on the node grid (relplot's ``smooth_round_to_grid``), from the cell sums."""
    scale = n_nodes - 1
    mean = cells["conf"] / cells["count"]
    node = np.clip(np.floor(mean * scale), 0, n_nodes - 2)
    frac_sum = scale * cells["conf"] - node * cells["count"]
    r_sum = cells["conf"] - cells["correct"]
    r_frac_sum = (scale * cells["conf_sq"] - node * cells["conf"]) - (scale * cells["conf_correct"] - node * cells["correct"])
    index = node.astype(np.int64)

    def spread(total: np.ndarray, upper: np.ndarray) -> np.ndarray:
        return (np.bincount(index, total - upper, minlength=n_nodes)
                + np.bincount(index + 1, upper, minlength=n_nodes))

    return spread(r_sum, r_frac_sum), spread(cells["count"], frac_sum)


# The transforms are NumPy's (pocketfft, as scipy.fft's): the same values to the last bit as scipy.fft, which
# fftconvolve uses (tests/metrics/test_smooth_sums.py), without importing scipy (0.3-0.4 s of a command's time).
@lru_cache(maxsize=64)
def _fft_size(n_nodes: int) -> int:
    """The padded length of fftconvolve's transforms of the reflected node arrays (3E - 2) and the kernel (E):
    ``scipy.fft.next_fast_len(4E - 3, real=True)``, the least 2^a 3^b 5^c at least that long."""
    return five_smooth_at_least(4 * n_nodes - 3)


def five_smooth_at_least(target: int) -> int:
    """The least integer >= ``target`` (>= 1) with no prime factor above 5 (scipy.fft.next_fast_len for real
    transforms)."""
    best = 1 << max(0, (target - 1).bit_length())  # a power of two always qualifies
    fives = 1
    while fives < best:
        threes = fives
        while threes < best:
            n = threes << max(0, (-(-target // threes) - 1).bit_length())  # threes x the least power of 2 reaching
            best = min(best, n)
            threes *= 3
        fives *= 5
    return best


def _node_spectrum(nodes: np.ndarray) -> np.ndarray:
    """The FFT of each row of the node arrays (R, E), reflected once about each end (relplot's
    ``ReflectedGaussianKernel``), at :func:`_fft_size`: what every bandwidth on this node grid convolves."""
    from numpy import fft

    flipped = nodes[:, ::-1]
    extended = np.concatenate([flipped[:, :-1], nodes, flipped[:, 1:]], axis=1)  # (R, 3E - 2)
    return fft.rfft(extended, _fft_size(nodes.shape[-1]), axis=-1)


# What depends on the bandwidth and the node grid only, not on the points (the kernel's transform, where the
# smoothed arrays are read), is kept across calls: relplot's bisection visits multiples of 2^-10, and the cases of
# a split mostly the same ones. At most this many bandwidths, 2 to 500 kB each (by the bandwidth).
_KEPT_BANDWIDTHS = 32


def _read_only(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for a in arrays:
        a.flags.writeable = False  # shared by every later call
    return arrays


@lru_cache(maxsize=_KEPT_BANDWIDTHS)
def _kernel_spectrum(n: int, sigma: float) -> np.ndarray:
    """The FFT, at :func:`_fft_size`, of the Gaussian density of standard deviation ``sigma`` sampled at
    linspace(0, 1, E = ``n``) around 1/2 (relplot's ``ReflectedGaussianKernel``; not normalised)."""
    from numpy import fft

    t = np.linspace(0.0, 1.0, n)
    kernel = np.exp(-(t - 0.5) ** 2 / (2 * sigma**2)) / (math.sqrt(2 * math.pi) * sigma)
    return _read_only(fft.rfft(kernel, _fft_size(n)))[0]


def _reflected_smoothing(spectrum: np.ndarray, n: int, sigma: float) -> np.ndarray:
    """relplot's ``ReflectedGaussianKernel.convolve`` of each row of the E = ``n`` node arrays whose
    :func:`_node_spectrum` is ``spectrum``: convolve with the Gaussian density sampled at linspace(0, 1, E) around
    1/2, keep the E central values.

    The FFTs of ``scipy.signal.fftconvolve(extended, kernel, mode="valid")`` (the same lengths, products and
    slices, so the same values to the last bit), the node arrays' transform shared by the bandwidths, the kernel's
    by the calls (:func:`_kernel_spectrum`)."""
    from numpy import fft

    size = _fft_size(n)
    full = fft.irfft(spectrum * _kernel_spectrum(n, sigma), size, axis=-1)
    start = n - 1 + n // 2  # the "valid" part starts at E - 1; relplot keeps E values from its middle
    return full[:, start:start + n]


@lru_cache(maxsize=_KEPT_BANDWIDTHS)
def _interpolation(n: int, sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """relplot's T = max(round(10 / sigma), 200) equispaced points t of [0, 1] on the grid linspace(0, 1, E = ``n``):
    each point's node below and above, and the weights 1 - w and w of the linear interpolation between them."""
    t = np.linspace(0.0, 1.0, max(round(10 / sigma), 200))
    scale = n - 1
    index = (t * scale).astype(np.int64).clip(0, scale - 1)
    w = t * scale - index
    return _read_only(index, index + 1, 1 - w, w)


def _sigma_value(spectrum: np.ndarray, n_nodes: int, sigma: float) -> float:
    """smECE_sigma from the :func:`_node_spectrum` of the node arrays (2, E) of r and of 1 (:func:`_node_arrays`)
    on relplot's grid for ``sigma``."""
    below, above, w_below, w_above = _interpolation(n_nodes, sigma)
    y = _reflected_smoothing(spectrum, n_nodes, sigma)
    smoothed = y[:, below] * w_below + y[:, above] * w_above  # each row linearly interpolated at the points t
    residual, density = smoothed[0], smoothed[1] + _DENSITY_EPS
    # relplot forms the smoothed residual (K*r)/density and its density-weighted mean; the density cancels
    return float(np.abs(residual).sum() / density.sum())


def _at_bandwidths(cells: dict[str, np.ndarray]):
    """sigma -> smECE_sigma of ``cells``, each bandwidth computed once and the node arrays and their FFT once per
    node grid (every sigma >= 0.01 shares relplot's grid of 1001 nodes)."""
    spectra: dict[int, np.ndarray] = {}
    values: dict[float, float] = {}

    def value(sigma: float) -> float:
        if sigma not in values:
            n_nodes = max(2000, round(20 / sigma)) // 2 + 1
            if n_nodes not in spectra:
                spectra[n_nodes] = _node_spectrum(np.stack(_node_arrays(cells, n_nodes)))
            values[sigma] = _sigma_value(spectra[n_nodes], n_nodes, sigma)
        return values[sigma]

    return value


def smooth_ece_sigma(sums: SmoothSums, sigma: float) -> float:
    """smECE at a fixed bandwidth ``sigma`` (relplot's ``smECE_sigma``); NaN without points."""
    if not sigma > 0:
        raise ValueError(f"sigma: expected a positive bandwidth, got {sigma}")
    cells = _occupied(sums)
    return math.nan if cells["count"].size == 0 else _at_bandwidths(cells)(sigma)


def smooth_ece(sums: SmoothSums, return_width: bool = False) -> float | tuple[float, float]:
    """smECE with relplot's bandwidth search (module docstring); NaN without points. With ``return_width`` also
    the bandwidth used."""
    cells = _occupied(sums)
    if cells["count"].size == 0:
        return (math.nan, math.nan) if return_width else math.nan

    at = _at_bandwidths(cells)

    def below_fixed_point(sigma: float) -> bool:
        return sigma < _MIN_SIGMA or sigma < at(sigma)

    width = 1.0
    if not below_fixed_point(width):
        lo, hi = 0.0, 1.0  # below_fixed_point(lo) holds, (hi) does not: relplot returns the latter end
        for _ in range(_HALVINGS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if below_fixed_point(mid) else (lo, mid)
        width = hi
    value = at(width)
    return (value, width) if return_width else value

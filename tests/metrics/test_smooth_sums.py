"""The sparse smooth-ECE sums of a case (its occupied cells only) equal the dense accumulation over the 2^20
cells to the last bit, alone and added in any form: per-case and pooled smECE do not change with the form."""
from __future__ import annotations

import pytest
import torch

from mcseg.metrics.smooth_ece import N_CELLS, SmoothSums, smooth_ece, smooth_sums


def _dense(f: torch.Tensor, y: torch.Tensor) -> SmoothSums:
    """The dense accumulation (every cell, voxel order): the reference."""
    sums, f, y = SmoothSums.zeros(), f.double().clamp(0, 1), y.double()
    cell = (f * N_CELLS).long().clamp_(max=N_CELLS - 1)
    for name, v in zip(SmoothSums.SUMS, (torch.ones_like(f), y, f, f * y, f * f)):
        getattr(sums, name).index_add_(0, cell, v)
    return sums


def _equal(a: SmoothSums, b: SmoothSums) -> bool:
    return all(torch.equal(getattr(a.dense(), k), getattr(b.dense(), k)) for k in SmoothSums.SUMS)


@pytest.mark.parametrize("n", [1, 1000, 300_000])  # 300_000: more than one chunk, beyond the sparse limit pooled
def test_sparse_sums_equal_the_dense_ones_bit_for_bit(n):
    g = torch.Generator().manual_seed(n)
    f1 = torch.rand(n, generator=g).float()
    y1 = torch.rand(n, generator=g) < f1
    f2, y2 = torch.rand(n, generator=g) ** 3, torch.rand(n, generator=g) < 0.5
    s1, s2 = smooth_sums(f1, y1), smooth_sums(f2, y2)
    assert s1.cells is not None and s1.cells.numel() <= n
    assert _equal(s1, _dense(f1, y1))
    pooled = _dense(f1, y1) + _dense(f2, y2)
    for total in (s1 + s2, _dense(f1, y1) + s2, s2 + _dense(f1, y1), smooth_sums(f2, y2, into=s1)):
        assert _equal(total, pooled)
        assert smooth_ece(total) == smooth_ece(pooled)


def test_a_dense_pooled_sum_is_added_into_not_copied():
    """A pooled sum over cases is dense once its cells outgrow the sparse form; adding a case into it (``+=``,
    as the evaluation's scorers pool cases) must not copy its 5 x 2^20 float64 cells (40 MB) each time, and
    must give the bits of ``+``."""
    g = torch.Generator().manual_seed(3)
    f, y = torch.rand(300_000, generator=g), torch.rand(300_000, generator=g) < 0.5
    pooled = smooth_sums(f[:150_000], y[:150_000]) + smooth_sums(f[150_000:], y[150_000:])
    assert pooled.cells is None  # beyond the sparse limit: dense
    case = smooth_sums(f[:1000] ** 2, y[:1000])
    expected = pooled + case
    before = pooled.count.data_ptr()
    pooled += case
    assert pooled.count.data_ptr() == before
    assert _equal(pooled, expected)
    pooled += _dense(f[:10], y[:10])  # dense into dense
    assert pooled.count.data_ptr() == before
    assert _equal(pooled, expected + _dense(f[:10], y[:10]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("n", [1000, 300_000])  # one step (NumPy bincounts), several (cells marked in the input's type)
def test_sums_of_other_float_types_and_at_0_and_1_are_the_float64_ones(n, dtype):
    g = torch.Generator().manual_seed(n)
    f = torch.rand(n, generator=g).to(dtype)
    f[::7], f[::11] = 1.0, 0.0
    y = torch.rand(n, generator=g) < 0.7
    assert _equal(smooth_sums(f, y), _dense(f, y))


def test_the_transform_length_is_scipys_next_fast_len():
    """The smooth ECE pads its transforms as scipy.signal.fftconvolve does (scipy.fft.next_fast_len, real)."""
    from scipy.fft import next_fast_len

    from mcseg.metrics.smooth_ece import five_smooth_at_least

    assert [five_smooth_at_least(n) for n in range(1, 20_001)] == [next_fast_len(n, True) for n in range(1, 20_001)]
    for n in (65_537, 1_000_003, 4 * 2**20 - 3):
        assert five_smooth_at_least(n) == next_fast_len(n, True)


@pytest.mark.parametrize("n_nodes", [12, 129, 1025, 4097])
def test_numpys_transforms_have_scipys_bits(n_nodes):
    """NumPy's rfft / irfft (pocketfft) give scipy.fft's values to the last bit at the smooth ECE's lengths, so
    the smooth ECE stays that of fftconvolve (and of relplot) without importing scipy."""
    import numpy as np
    from scipy import fft as scipy_fft

    from mcseg.metrics.smooth_ece import _fft_size

    size = _fft_size(n_nodes)
    rows = np.random.default_rng(n_nodes).random((4, 3 * n_nodes - 2))
    spectrum = np.fft.rfft(rows, size, axis=-1)
    assert np.array_equal(spectrum, scipy_fft.rfft(rows, size, axis=-1))
    assert np.array_equal(np.fft.irfft(spectrum, size, axis=-1), scipy_fft.irfft(spectrum, size, axis=-1))


def test_a_smooth_ece_imports_no_scipy():
    """scipy.fft cost a folder evaluation 0.3-0.4 s of imports (#58); the transforms are NumPy's now."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, torch
        from mcseg.metrics.smooth_ece import smooth_ece, smooth_sums
        g = torch.Generator().manual_seed(0)
        f = torch.rand(5000, generator=g, dtype=torch.float64)
        value = smooth_ece(smooth_sums(f, torch.rand(5000, generator=g, dtype=torch.float64) < f))
        assert 0 <= value < 0.1, value
        print(sorted(m for m in sys.modules if m.split(".")[0] == "scipy")[:3])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"

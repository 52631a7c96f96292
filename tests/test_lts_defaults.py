"""Issue #58 item 5: LTS on a folder takes its sizes from the data and the device where the settings leave them
unset: patches no larger than the fit cases, an epoch of about one pass over their voxels, and on a CPU an epoch
count bounded by a budget of voxel passes (before: 64^3 patches for 35 x 50 x 35 volumes, 50 steps, 200 epochs)."""
from __future__ import annotations

import math

import pytest

from mcseg.calibration.lts import CPU_VOXEL_BUDGET, LTSConfig, resolve_config


def test_unset_sizes_follow_the_cases_and_the_cpu_budget():
    shapes = [(35, 50, 35), (40, 47, 30), (33, 52, 36)] * 8
    cfg, chosen = resolve_config(LTSConfig(), shapes, "cpu")
    assert cfg.patch_size == [40, 52, 36] == chosen["patch_size"]  # the largest case, never above 64
    per_step = cfg.batch_size * math.prod(cfg.patch_size)
    voxels = sum(math.prod(s) for s in shapes)
    assert cfg.steps_per_epoch == math.ceil(voxels / per_step)
    assert cfg.max_epochs == CPU_VOXEL_BUDGET // (cfg.steps_per_epoch * per_step)
    assert cfg.steps_per_epoch * cfg.max_epochs * per_step <= CPU_VOXEL_BUDGET


def test_set_sizes_are_kept_and_large_cases_get_the_full_patch_on_a_gpu():
    cfg, chosen = resolve_config(LTSConfig(patch_size=[16, 16, 16], steps_per_epoch=3, max_epochs=4), [(9, 9, 9)])
    assert (cfg.patch_size, cfg.steps_per_epoch, cfg.max_epochs, chosen) == ([16, 16, 16], 3, 4, {})
    cfg, chosen = resolve_config(LTSConfig(), [(512, 512, 200)] * 3, "cuda")
    assert (cfg.patch_size, cfg.steps_per_epoch, cfg.max_epochs) == ([64, 64, 64], 50, 200)


def test_2d_slices_take_the_plane_of_the_slice_axis():
    cfg, _ = resolve_config(LTSConfig(dims=2, slice_axis=0), [(20, 300, 180)])
    assert cfg.patch_size == [256, 180]


def test_a_patch_that_does_not_match_dims_is_refused():
    with pytest.raises(ValueError, match="patch_size"):
        LTSConfig(dims=2, patch_size=[8, 8, 8])

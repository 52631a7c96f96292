"""Issue #58 item 5: LTS on a folder takes its sizes from the data and the device where the settings leave them
unset: patches no larger than the fit cases, epochs of 50 steps, and on a CPU an epoch count bounded by a budget of
voxel passes (before: 64^3 patches for 35 x 50 x 35 volumes, 50 steps, 200 epochs)."""
from __future__ import annotations

import math

import pytest

from mcseg.calibration.lts import BUDGET_LR, CPU_VOXEL_BUDGET, LR, LTSConfig, lr_factor, resolve_config


@pytest.mark.parametrize("n_cases", [1, 24])
def test_unset_sizes_follow_the_cases_and_the_cpu_budget(n_cases):
    """Epochs of 50 steps however few the cases (an epoch of one pass over 1 hippocampus case was 1 step, so the
    patience of 10 epochs stopped the fit after 10 steps without a better held-out NLL: 6% above the NLL of the
    settings before #58 on 2 cases, docs/posthoc.md); the epochs bounded by the CPU budget."""
    shapes = ([(35, 50, 35), (40, 47, 30), (33, 52, 36)] * 8)[:n_cases]
    cfg, chosen = resolve_config(LTSConfig(), shapes, "cpu")
    assert cfg.patch_size == chosen["patch_size"] == [max(s[i] for s in shapes) for i in range(3)]  # never above 64
    per_step = cfg.batch_size * math.prod(cfg.patch_size)
    assert cfg.steps_per_epoch == 50
    assert cfg.max_epochs == min(200, CPU_VOXEL_BUDGET // (cfg.steps_per_epoch * per_step)) >= 10
    assert cfg.steps_per_epoch * cfg.max_epochs * per_step <= CPU_VOXEL_BUDGET


def test_the_cpu_budget_fits_the_time_aim():
    """The budget at the measured 1.63 us a voxel and step on one thread (the fit on the 31 hippocampus validation
    cases: 205 CPU s for 650 steps of two 38 x 58 x 44 patches, held-out NLL included, docs/posthoc.md) leaves a
    minute of the issue's 5 for start-up, reading the cases and the check of the arg-max."""
    assert CPU_VOXEL_BUDGET * 1.63e-6 <= 4 * 60


def test_set_sizes_are_kept_and_large_cases_get_the_full_patch_on_a_gpu():
    set_sizes = LTSConfig(patch_size=[16, 16, 16], steps_per_epoch=3, max_epochs=4, lr=0.2, lr_schedule="constant")
    cfg, chosen = resolve_config(set_sizes, [(9, 9, 9)])
    assert (cfg.patch_size, cfg.steps_per_epoch, cfg.max_epochs, cfg.lr, cfg.lr_schedule, chosen) == (
        [16, 16, 16], 3, 4, 0.2, "constant", {})
    cfg, chosen = resolve_config(LTSConfig(), [(512, 512, 200)] * 3, "cuda")
    assert (cfg.patch_size, cfg.steps_per_epoch, cfg.max_epochs) == ([64, 64, 64], 50, 200)
    assert (cfg.lr, cfg.lr_schedule) == (chosen["lr"], chosen["lr_schedule"]) == LR


def test_the_learning_rate_is_larger_on_the_cpu_budget_only():
    """Where the CPU budget sets the epochs, 0.1 (at 0.01 the fit still improved at the budget's end; a cosine decay
    of 0.1 ended higher on 31 cases, docs/posthoc.md); with the epochs set, or on a GPU, the settings before #58."""
    cfg, chosen = resolve_config(LTSConfig(), [(35, 50, 35)] * 2, "cpu")
    assert (cfg.lr, cfg.lr_schedule) == (chosen["lr"], chosen["lr_schedule"]) == BUDGET_LR == (0.1, "constant")
    cfg, _ = resolve_config(LTSConfig(max_epochs=30), [(35, 50, 35)])
    assert (cfg.lr, cfg.lr_schedule) == LR == (0.01, "constant")
    cfg, chosen = resolve_config(LTSConfig(lr=0.05, lr_schedule="cosine"), [(35, 50, 35)], "cpu")
    assert (cfg.lr, cfg.lr_schedule, "lr" in chosen, "lr_schedule" in chosen) == (0.05, "cosine", False, False)


def test_2d_slices_take_the_plane_of_the_slice_axis():
    cfg, _ = resolve_config(LTSConfig(dims=2, slice_axis=0), [(20, 300, 180)])
    assert cfg.patch_size == [256, 180]


def test_a_patch_that_does_not_match_dims_is_refused():
    with pytest.raises(ValueError, match="patch_size"):
        LTSConfig(dims=2, patch_size=[8, 8, 8])



def test_the_cosine_schedule_decays_to_zero_at_the_end_of_the_budget():
    assert [lr_factor("constant", t, 8) for t in (0, 4, 8)] == [1.0, 1.0, 1.0]
    assert [lr_factor("cosine", t, 8) for t in (0, 4, 8, 9)] == pytest.approx([1.0, 0.5, 0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="lr_schedule='step'"):
        LTSConfig(lr_schedule="step")


def test_the_fit_follows_the_schedule(monkeypatch):
    """The optimizer's learning rates at each step are ``lr x lr_factor`` (both parameter groups), over the whole
    budget of ``max_epochs x steps_per_epoch`` steps."""
    import numpy as np
    import torch

    import mcseg.calibration.lts as lts

    seen = []
    step = torch.optim.Adam.step

    def spy(self, *a, **k):
        seen.append([g["lr"] for g in self.param_groups])
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    rng = np.random.default_rng(0)
    cases = [lts.CaseLogits(f"c{i}", rng.normal(size=(2, 6, 6, 6)).astype(np.float32), rng.integers(0, 2, (6, 6, 6)))
             for i in range(3)]
    cfg = LTSConfig(lr=0.1, lr_schedule="cosine", steps_per_epoch=2, max_epochs=2, patience=5, batch_size=1)
    lts.fit_lts(cases, cfg)
    fan_in = 2 * lts.KERNEL ** 3
    assert [s[0] for s in seen] == pytest.approx([0.1 * lr_factor("cosine", t, 4) for t in range(4)])
    assert [s[1] for s in seen] == pytest.approx([0.1 / fan_in * lr_factor("cosine", t, 4) for t in range(4)])

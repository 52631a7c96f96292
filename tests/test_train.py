"""End-to-end runs on tiny synthetic tasks and the real hippocampus data."""
from __future__ import annotations

import csv
import ctypes
import json
import math
import os
import platform
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from mcseg.inference.build import load_checkpoint
from mcseg.training.build import build_run
from mcseg.training.trainer import Trainer
from mcseg.evaluate import evaluate
from mcseg.rundir import LaunchRefused
from mcseg.train import train

from .conftest import TINY_2D, TINY_3D, run_cli


def _check_run_dir(run_dir, n_test: int) -> dict:
    for path in ("checkpoints/last.pt", "checkpoints/best.pt", "split.json", "eval/test/per_case.csv",
                 "eval/test/summary.json"):
        assert (run_dir / path).is_file(), path
    assert any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    split = json.loads((run_dir / "split.json").read_text())
    assert len(split["test"]) == n_test
    assert not set(split["train"]) & set(split["test"]) and not set(split["val"]) & set(split["test"])
    predictions = sorted(p for p in (run_dir / "eval/test/predictions").glob("*.nii.gz")
                         if not p.name.endswith(("_probs.nii.gz", "_entropy.nii.gz")))
    assert [p.name for p in predictions] == [f"{c}.nii.gz" for c in split["test"]]
    summary = json.loads((run_dir / "eval/test/summary.json").read_text())
    for key in ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece"):
        assert summary[key] is not None and math.isfinite(summary[key])
    with open(run_dir / "eval/test/per_case.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["case"] for r in rows} == set(split["test"])
    return summary


def _what_keep_freed_memory_does_here() -> str:
    """mcseg.runtime.keep_freed_memory's record on this machine, from its documented cases (not from calling it)."""
    if os.environ.get("MCSEG_KEEP_FREED_MEMORY", "1") == "0":
        return "off (MCSEG_KEEP_FREED_MEMORY=0)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "unchanged (not glibc)"
    # glibc: both thresholds raised to 1 GiB where it accepts that mmap threshold, else mmap turned off
    libc = ctypes.CDLL(None)
    threshold = libc.mallopt(-3, 1 << 30) == 1  # M_MMAP_THRESHOLD, as glibc's malloc.h numbers it
    if threshold:
        return "glibc mallopt: mmap and trim thresholds 1 GiB"
    return "glibc mallopt: mmap off, trim threshold 1 GiB"


def test_build_run_gives_the_trainer_train_would_fit_and_it_trains_an_epoch(make_cfg, tmp_path):
    """scripts/benchmark.py times the trainer of train(cfg) through build_run: built, resumed if asked, not fitted
    (no checkpoint, no result), the run directory begun (split.json), and its epochs run."""
    run = build_run(make_cfg(TINY_2D))
    try:
        trainer = run.trainer
        assert (trainer.epoch, trainer.global_step, trainer.history) == (0, 0, [])
        assert (tmp_path / "run/split.json").is_file()
        assert not (tmp_path / "run/checkpoints").exists() and not (tmp_path / "run/result.json").exists()
        assert trainer.provenance["split"]["test"] == [r.case_id for r in run.splits["test"]]
        assert run.identity["dataset"] == run.dataset.name and run.device_info["device"] == "cpu"
        metrics = trainer.train_epoch(0)
        assert math.isfinite(metrics["train/loss"]) and trainer.global_step == len(trainer.loader)
    finally:
        run.trackers.close()


def test_synthetic_2d_run_produces_the_run_directory(make_cfg, tmp_path, caplog):
    cfg = make_cfg(TINY_2D)
    with caplog.at_level("INFO", logger="mcseg.train"):
        result = train(cfg)
    device = json.loads((tmp_path / "run/result.json").read_text())["device"]  # also logged at the start
    assert device == {"device": "cpu", "name": device["name"], "torch": torch.__version__, "cuda": None,
                      "precision": "float32", "channels_last": False, "compile": False,
                      "cpu_threads": torch.get_num_threads(), "omp_wait_policy": device["omp_wait_policy"],
                      "freed_memory": device["freed_memory"],
                      "training_batches": {"device_cache": False, "why": "auto: cpu is not a CUDA device", "workers": 0}}
    assert device["freed_memory"] == _what_keep_freed_memory_does_here()
    assert f"device: device cpu, name {device['name']}, torch {torch.__version__}" in caplog.text
    summary = _check_run_dir(tmp_path / "run", n_test=2)
    assert result["test/mean_foreground_dice"] == pytest.approx(summary["mean_foreground_dice"])
    state = load_checkpoint(tmp_path / "run/checkpoints/last.pt")
    assert state["epoch"] == 2 and {"optimizer", "scheduler", "loss", "rng", "config"} <= set(state)


def test_synthetic_3d_run_uses_sliding_window(make_cfg, tmp_path):
    cfg = make_cfg(TINY_3D + ["inference.save_probabilities=true"])
    train(cfg)
    _check_run_dir(tmp_path / "run", n_test=1)
    import nibabel as nib

    test_case = json.loads((tmp_path / "run/split.json").read_text())["test"][0]
    probs = nib.load(tmp_path / f"run/eval/test/predictions/{test_case}_probs.nii.gz").get_fdata()
    assert probs.shape == (24, 24, 20, 4)
    assert probs.sum(-1) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_resume_continues_at_the_right_epoch_with_saved_optimizer(make_cfg, tmp_path, monkeypatch):
    common = TINY_2D + ["trainer.max_epochs=3", "scheduler=constant", "trainer.deterministic=true"]
    train(make_cfg(common, output_dir=tmp_path / "straight"))
    straight = load_checkpoint(tmp_path / "straight/checkpoints/last.pt")

    original, validate = Trainer.train_epoch, Trainer.validate

    def killed_in_the_third_validation(self, epoch, full=False):
        if epoch == 2:  # after the third epoch's steps were logged, before its checkpoint
            raise KeyboardInterrupt("simulated interruption")
        return validate(self, epoch, full)

    monkeypatch.setattr(Trainer, "validate", killed_in_the_third_validation)
    with pytest.raises(KeyboardInterrupt):
        train(make_cfg(common, output_dir=tmp_path / "resumed"))
    interrupted = load_checkpoint(tmp_path / "resumed/checkpoints/last.pt")
    assert interrupted["epoch"] == 2 and interrupted["optimizer"]["state"]
    monkeypatch.setattr(Trainer, "validate", validate)

    started = []
    monkeypatch.setattr(Trainer, "train_epoch", lambda self, epoch: started.append(epoch) or original(self, epoch))
    with pytest.raises(LaunchRefused, match="last.pt exists"):  # an existing run is never silently overwritten
        train(make_cfg(common, output_dir=tmp_path / "resumed"))
    train(make_cfg(common + ["trainer.resume=true"], output_dir=tmp_path / "resumed"))
    assert started == [2]
    resumed = load_checkpoint(tmp_path / "resumed/checkpoints/last.pt")
    assert resumed["epoch"] == 3
    for key, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, rtol=0, atol=1e-6, msg=key)
    # TensorBoard: what the interrupted run logged after its checkpoint is purged, not repeated
    assert _tensorboard_steps(tmp_path / "resumed") == _tensorboard_steps(tmp_path / "straight")
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]  # 1-based, as in the log


def _tensorboard_steps(run: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.slow
def test_evaluate_reproduces_the_runs_own_evaluation(make_cfg, tmp_path):
    train(make_cfg(TINY_2D))
    run = tmp_path / "run"
    own = json.loads((run / "eval/test/summary.json").read_text())
    cfg = make_cfg([f"ckpt={run}/checkpoints/best.pt", f"eval_dir={tmp_path}/again"], config_name="evaluate",
                   output_dir=tmp_path / "evaluate")
    again = evaluate(cfg)
    for key in ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece"):
        assert again[key] == pytest.approx(own[key], rel=1e-6, abs=1e-9), key
    assert (tmp_path / "again/per_case.csv").read_text() == (run / "eval/test/per_case.csv").read_text()


@pytest.mark.slow
def test_hippocampus_preset_trains_on_the_shared_copy(make_cfg, tmp_path, hippocampus_root):
    cfg = make_cfg(["dataset=hippocampus", f"dataset.root={hippocampus_root}", "debug=fast",
                    "model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1",
                    "dataset.sampling.patch_size=[32,32]", "logger.images=1"])
    train(cfg)
    summary = _check_run_dir(tmp_path / "run", n_test=31)
    assert cfg.dataset.class_names == ["background", "Anterior", "Posterior"]
    assert summary["n_cases"] == 31


def test_cli_trains_and_evaluates(tmp_path):
    run = tmp_path / "cli_run"
    done = run_cli("train.py", TINY_2D + [f"hydra.run.dir={run}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "foreground mean" in done.stdout and "ECE" in done.stdout
    assert (run / ".hydra/config.yaml").is_file() and (run / "train.log").is_file()
    done = run_cli("evaluate.py", [f"ckpt={run}/checkpoints/best.pt", "split=val",
                                   f"hydra.run.dir={tmp_path / 'eval_job'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run / "eval/val/summary.json").is_file()


def test_full_validation_every_n_epochs_next_to_a_capped_running_one(make_cfg, tmp_path, one_thread):
    """val/* on the first val_max_cases cases each epoch; val_full/* on every case every N epochs,
    equal to evaluate.py's numbers for the same checkpoint on the whole validation split."""
    cfg = make_cfg(TINY_2D + ["dataset.n_cases=16", "trainer.max_epochs=2", "trainer.val_max_cases=1", "trainer.full_val_every=2",
                              "trainer.monitor=val_full/mean_foreground_dice", "posthoc.fit=[]", "posthoc.apply=[]"])
    result = train(cfg)
    assert result["best_epoch"] == 2  # the only epoch with a full validation (numbered from 1)
    n_val = len(json.loads((tmp_path / "run" / "split.json").read_text())["val"])
    assert n_val > 1
    ecfg = make_cfg([f"ckpt={tmp_path / 'run' / 'checkpoints' / 'best.pt'}", "split=val", "posthoc.apply=[]",
                     f"evaluation.bootstrap_samples={cfg.evaluation.bootstrap_samples}"],
                    config_name="evaluate", output_dir=tmp_path / "eval_job")
    summary = evaluate(ecfg)
    assert summary["n_cases"] == n_val
    assert result["val_full/mean_foreground_dice"] == pytest.approx(summary["mean_foreground_dice"], rel=1e-6)
    assert result["val_full/mean_ece"] == pytest.approx(summary["mean_ece"], rel=1e-6)


@pytest.mark.parametrize("overrides, key", [
    (["trainer.full_val_every=2"], "trainer.full_val_every"),  # without a cap it would repeat val/*
    (["trainer.monitor=val_full/mean_ece"], "trainer.monitor"),
    # a typo in the metric that selects best.pt: before, trained to the end and kept the last epoch with a warning
    (["trainer.monitor=val/mean_foreground_dise"], "trainer.monitor'=val/mean_foreground_dise: not a validation"),
    (["trainer.monitor=vall/mean_foreground_dice"], "trainer.monitor'=vall/mean_foreground_dice: not a validation"),
])
def test_full_validation_settings_are_checked(make_cfg, overrides, key):
    from mcseg.errors import ConfigError

    with pytest.raises(ConfigError, match=key):
        train(make_cfg(TINY_2D + ["trainer.val_max_cases=null", *overrides]))

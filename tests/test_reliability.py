"""Runs survive being killed, checkpoints never corrupt, untrusted files cannot run code."""
from __future__ import annotations

import errno
import json
import math
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from mcseg.config import validate_train_config
from mcseg.data.sampling import PatchDataset
from mcseg.training import checkpoint
from mcseg.training.checkpoint import save_checkpoint
from mcseg.inference.build import load_checkpoint
from mcseg.errors import ConfigError, NonFiniteLossError
from mcseg.train import train

from .conftest import ROOT, TINY_2D

# Deterministic CPU runs: single-process loading, deterministic algorithms, 3 epochs of 4 steps.
EXACT = TINY_2D + ["trainer.deterministic=true", "trainer.max_epochs=3", "dataset.sampling.samples_per_epoch=8",
                   "trainer.checkpoint_every_n_steps=2", "scheduler=cosine"]


def _train_subprocess(run_dir: Path, extra: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    env.pop("MCSEG_TRACEBACK", None)
    return subprocess.run(  # a session of its own: a signal sent to its process group spares pytest
        [sys.executable, str(ROOT / "tests/interrupt_wrapper.py"), *EXACT, *extra, f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, start_new_session=True,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("straight") / "run"
    done = _train_subprocess(run, [])
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def _assert_same_run(a: Path, b: Path) -> None:
    sa, sb = load_checkpoint(a / "checkpoints/last.pt"), load_checkpoint(b / "checkpoints/last.pt")
    assert sa["epoch"] == sb["epoch"] == 3
    for key in sa["model"]:
        assert torch.equal(sa["model"][key], sb["model"][key]), f"weights differ at {key}"
    summary_a = json.loads((a / "eval/test/summary.json").read_text())
    summary_b = json.loads((b / "eval/test/summary.json").read_text())
    for key in ("mean_foreground_dice", "mean_foreground_hd95_mm", "mean_ece", "mean_classwise_ece"):
        assert summary_a[key] == summary_b[key], key


@pytest.mark.parametrize(
    "plant, resume_env",
    [
        # mid-epoch 2, after the mid-epoch checkpoint at step 2 of that epoch; resumed in a process given one
        # torch thread, which must take the run's own count back (the count orders float reductions: issue #21)
        pytest.param({"MCSEG_KILL_AT_STEP": "6"}, {"OMP_NUM_THREADS": "1"}, marks=pytest.mark.slow),
        pytest.param({"MCSEG_KILL_AT_STEP": "9"}, {}, marks=pytest.mark.slow),  # first step of epoch 3
        pytest.param({"MCSEG_KILL_IN_SAVE": "4"}, {}, marks=pytest.mark.slow),  # while writing a checkpoint
    ],
    ids=["mid-epoch-other-threads", "epoch-start", "during-checkpoint-write"],
)
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, uninterrupted, plant, resume_env):
    run = tmp_path / "run"
    killed = _train_subprocess(run, [], env=plant)
    assert killed.returncode == -signal.SIGKILL
    load_checkpoint(run / "checkpoints/last.pt")  # the previous checkpoint is intact
    resumed = _train_subprocess(run, ["trainer.resume=true"], env=resume_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(uninterrupted, run)


@pytest.mark.slow  # every signal and resume test of this module trains in subprocesses: the slow run (.ci/run)
def test_sigterm_writes_a_checkpoint_and_resume_finishes(tmp_path, uninterrupted):
    run = tmp_path / "run"
    stopped = _train_subprocess(run, [], env={"MCSEG_TERM_AT_STEP": "7"})
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "trainer.resume=true" in stopped.stderr
    state = load_checkpoint(run / "checkpoints/last.pt")
    assert (state["epoch"], state["step_in_epoch"]) == (1, 3)
    resumed = _train_subprocess(run, ["trainer.auto_resume=true"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(uninterrupted, run)


# Ctrl-C takes the same path as SIGTERM (one handler); its group-wide variant runs with the slow tests (-m slow)
@pytest.mark.parametrize("sig, code", [pytest.param("TERM", 143, marks=pytest.mark.slow),
                                       pytest.param("INT", 130, marks=pytest.mark.slow)])
def test_signal_to_the_process_group_with_loader_workers_checkpoints_and_resumes(tmp_path, uninterrupted, sig, code):
    """SLURM and torchrun signal every process of the job (loader workers too); Ctrl-C does the same to the
    terminal's foreground group. The workers must survive it so that the main process checkpoints."""
    run, workers = tmp_path / "run", ["dataset.sampling.num_workers=2"]
    stopped = _train_subprocess(run, workers, env={"MCSEG_GROUP_SIGNAL_AT_STEP": "7", "MCSEG_GROUP_SIGNAL": sig})
    assert stopped.returncode == code, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "trainer.resume=true" in stopped.stderr, stopped.stderr[-3000:]
    assert json.loads((run / "status.json").read_text())["status"] == "interrupted"
    state = load_checkpoint(run / "checkpoints/last.pt")
    assert (state["epoch"], state["step_in_epoch"]) == (1, 3)
    # SIGTERM is what a SLURM requeue follows with auto_resume; Ctrl-C, a user's explicit resume
    resumed = _train_subprocess(run, [*workers, "trainer.auto_resume=true" if sig == "TERM" else "trainer.resume=true"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(uninterrupted, run)


@pytest.mark.slow
def test_sigterm_during_validation_stops_after_the_case_and_resume_finishes(tmp_path, uninterrupted):
    """SLURM's grace period and torchrun's 30 s before SIGKILL are shorter than a full validation."""
    run = tmp_path / "run"
    stopped = _train_subprocess(run, [], env={"MCSEG_TERM_IN_VALIDATION": "2"})  # epoch 2's (one case each)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    state = load_checkpoint(run / "checkpoints/last.pt")
    assert (state["epoch"], state["step_in_epoch"], len(state["history"])) == (1, 4, 1)  # its steps, not recorded
    resumed = _train_subprocess(run, ["trainer.resume=true"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(uninterrupted, run)


def test_a_second_ctrl_c_stops_at_once(make_cfg, monkeypatch):
    from mcseg.training.trainer import Trainer

    trainer = Trainer.__new__(Trainer)  # the handler's state only
    trainer._stop_signal = None
    trainer._request_stop(signal.SIGINT, None)
    assert trainer._stop_requested
    with pytest.raises(KeyboardInterrupt):
        trainer._request_stop(signal.SIGINT, None)


class _RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_that_runs_code_on_unpickling_is_refused(tmp_path):
    evil = _RunsCode()
    evil.marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": evil, "optimizer": {}, "epoch": 0, "config": {}}, f)
    with pytest.raises(ValueError, match="evil.pt"):
        load_checkpoint(path)
    assert not evil.marker.exists()


@pytest.mark.parametrize("target", ["os.system", "subprocess.run", "builtins.eval", "torch.hub.load"])
def test_target_outside_the_allow_list_is_refused(make_cfg, target):
    cfg = make_cfg(TINY_2D)
    with open_dict(cfg):
        cfg.model._target_ = target
    with pytest.raises(ConfigError, match="not an allowed target"):
        validate_train_config(cfg)


def test_evaluate_refuses_a_checkpoint_config_with_a_foreign_target(make_cfg, tmp_path):
    from mcseg.evaluate import evaluate

    train(make_cfg(TINY_2D))
    state = load_checkpoint(tmp_path / "run/checkpoints/best.pt")
    state["config"]["loss"]["_target_"] = "os.system"
    save_checkpoint(tmp_path / "tampered.pt", state)
    (tmp_path / "eval").mkdir()
    cfg = make_cfg([f"ckpt={tmp_path / 'tampered.pt'}"], config_name="evaluate", output_dir=tmp_path / "eval")
    with pytest.raises(ConfigError, match="os.system"):
        evaluate(cfg)


def test_full_disk_during_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    good = {"model": {"w": torch.ones(3)}, "optimizer": {}, "epoch": 1, "config": {}}
    save_checkpoint(path, good)

    def disk_full(obj, f, *args, **kwargs):  # f: the open temporary file
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(OSError, match=r"no space left on device writing .*last\.pt \(.* free on its file system\)"):
        save_checkpoint(path, {**good, "epoch": 2})
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left behind


def _poison(monkeypatch, at_sample: int) -> None:
    original = PatchDataset.__getitem__

    def getitem(self, index):
        sample = original(self, index)
        if index == at_sample:
            sample["image"][:] = float("nan")
        return sample

    monkeypatch.setattr(PatchDataset, "__getitem__", getitem)


def test_nan_batch_stops_the_run_naming_epoch_step_and_cases(make_cfg, tmp_path, monkeypatch):
    _poison(monkeypatch, at_sample=4 + 2)  # epoch 2 (4 samples an epoch), batch 1
    with pytest.raises(NonFiniteLossError, match=r"epoch 2, step 1 \(batch of training cases \['synthetic2d_"):
        train(make_cfg(TINY_2D))
    assert load_checkpoint(tmp_path / "run/checkpoints/last.pt")["epoch"] == 1  # the last good one


def test_nan_at_the_first_step_says_there_is_no_checkpoint_yet(make_cfg, tmp_path, monkeypatch):
    _poison(monkeypatch, at_sample=1)  # epoch 1, step 0: nothing has been written yet
    with pytest.raises(NonFiniteLossError, match=r"epoch 1, step 0 .*no checkpoint has been written yet") as stop:
        train(make_cfg(TINY_2D))
    assert "last.pt" not in str(stop.value)
    assert not (tmp_path / "run/checkpoints/last.pt").exists()


def test_nan_batch_is_skipped_when_configured(make_cfg, tmp_path, monkeypatch):
    _poison(monkeypatch, at_sample=1)
    train(make_cfg(TINY_2D + ["trainer.nonfinite=skip"]))
    state = load_checkpoint(tmp_path / "run/checkpoints/last.pt")
    assert state["nonfinite_skips"] == 1
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_unwritable_output_directory_is_a_clear_error(tmp_path):
    from .conftest import run_cli

    if os.geteuid() == 0:
        blocked = tmp_path / "file_not_dir"
        blocked.write_text("")
        run_dir = blocked / "run"  # a path below a regular file cannot be created, even by root
    else:
        run_dir = Path("/proc/mcseg_run")
    done = run_cli("train.py", TINY_2D + [f"hydra.run.dir={run_dir}"])
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(run_dir) in lines[0], done.stderr  # one line naming the path, no traceback


@pytest.mark.parametrize("built_with", ["12.8", None])
def test_unusable_cuda_is_an_error_when_asked_for_and_a_warning_under_auto(monkeypatch, caplog, built_with):
    """A broken CUDA install never trains on the CPU without a word."""
    from mcseg.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", built_with)
    with pytest.raises(ValueError, match="trainer.device='cuda' but " + ("CUDA is unusable" if built_with else
                                                                         "torch .* is a CPU build")):
        resolve_device("cuda")
    if built_with:  # an NVIDIA device file may exist on a GPU machine without CUDA torch: not required here
        with caplog.at_level("WARNING", logger="mcseg.runtime"):
            assert resolve_device("auto").type == "cpu"
        assert "CUDA is unusable" in caplog.text and "training on the CPU" in caplog.text


@pytest.mark.cuda
def test_out_of_memory_on_cuda_stitches_each_case_on_the_cpu_and_frees_the_gpu(caplog):
    """A real CUDA OOM, over several cases: the GPU holds the input and the finished logits but not the
    stitching (logits, count map and windows at once), so each case falls back to stitching in host memory,
    its logits come back to the GPU (where the caller's statistics live, as the CPU test
    ``test_out_of_memory_retries_with_host_stitching_and_returns_logits_on_the_device`` requires), and
    none leaves GPU memory behind for the next. (First run on an H200: the cap left no room for the
    returned logits, written when the fallback returned them on the CPU.)"""
    from mcseg.inference import volume as inference

    model = torch.nn.Conv3d(1, 2, 3, padding=1).cuda()
    shape = (1, 256, 256, 256)  # 64 MiB of input; stitching on the GPU takes 3 times that (2-class logits
    volume_bytes = 4 * math.prod(shape)  # and MONAI's count map), the returned logits 2 times
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((baseline + 3 * volume_bytes + 32 * 2**20) / total)
    try:
        cfg = inference.InferenceConfig(roi_size=[64, 64, 64], sw_batch_size=2, overlap=0.25)
        for case in range(3):
            image = torch.full(shape, float(case), device="cuda")
            with caplog.at_level("WARNING", logger="mcseg.inference.volume"):
                out = inference.predict_logits(model, image, 3, 16, cfg)
            assert out.device.type == "cuda" and out.shape == (2, *shape[1:])
            del image, out
            assert torch.cuda.memory_allocated() <= baseline + 2**20, f"case {case} left memory on the GPU"
        assert caplog.text.count("stitching in host memory") == 3
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


@pytest.mark.slow
def test_gpu_setup_keeps_the_interpreters_torch_and_insists_on_a_cuda_build(tmp_path):
    """``MCSEG_GPU=1 bash scripts/setup.sh`` (on a throw-away project of the same layout): .venv sees the torch
    of the interpreter that ran it, installs no other, and the set-up fails unless that torch is a CUDA build.
    Needs pip's index (the editable install builds with setuptools)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "mcseg").mkdir()
    (tmp_path / "mcseg/__init__.py").write_text("")
    (tmp_path / "scripts/setup.sh").write_text((ROOT / "scripts/setup.sh").read_text())
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68", "wheel"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "mcseg"\nversion = "0"\ndependencies = ["torch>=2.2"]\n'
        '[project.optional-dependencies]\ntest = []\n')
    # outside CI's rule: under CI=true the throw-away project's missing nnU-Net export code (scripts/nnunet-tests.txt)
    # would end the set-up before the CUDA check this test is about (tests/test_test_dependencies.py tests that rule)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**env, "MCSEG_GPU": "1", "PYTHON": sys.executable})
    seen = subprocess.run([str(tmp_path / ".venv/bin/python"), "-c", "import torch; print(torch.__file__)"],
                          capture_output=True, text=True)
    assert seen.stdout.strip() == torch.__file__, seen.stderr
    if torch.version.cuda:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and "is a CPU build" in done.stderr, done.stderr

"""Shared fixtures: compose the real configs and shrink them (lightning-hydra-template style)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = str(ROOT / "configs")
HIPPOCAMPUS = ROOT.parent / "shared" / "data" / "hippocampus"

# A tiny synthetic 2D task and network: seconds per run on a CPU.
TINY_2D = [
    "debug=fast", "logger.images=1", "dataset.n_cases=8", "dataset.shape=[32,32]",
    "dataset.sampling.patch_size=[32,32]", "model.channels=[8,16,32]", "model.strides=[2,2]",
    "model.num_res_units=1",
]
TINY_3D = [
    "dataset=synthetic3d", "debug=fast", "logger.images=1", "dataset.n_cases=6", "dataset.shape=[24,24,20]",
    "dataset.sampling.patch_size=[16,16,16]", "model.channels=[8,16,32]", "model.strides=[2,2]",
    "model.num_res_units=1", "inference.overlap=0.25",
]


def compose_config(config_name: str, overrides: list[str], output_dir: Path) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        del cfg.hydra
    return cfg


@pytest.fixture
def make_cfg(tmp_path):
    def _make(overrides=(), config_name="train", output_dir=None):
        return compose_config(config_name, list(overrides), Path(output_dir or tmp_path / "run"))

    return _make


def in_ci() -> bool:
    """True under ``CI=true`` (or ``1``), as CI services set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require(module: str, why: str):
    """``module`` imported, for a test that needs a dependency of the test set-up (the ``test`` extra, or
    nnU-Net's export code that scripts/setup.sh installs). Missing: a skip saying ``why`` on a developer's
    machine, an error under ``CI=true`` (a skip there would let a broken set-up pass as green)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if in_ci():
            pytest.fail(f"{module} cannot be imported ({exc}): {why}. Under CI={os.environ['CI']}: a missing test "
                        f"dependency is an error, not a skip (scripts/setup.sh installs it)", pytrace=False)
        pytest.skip(f"{module} is not installed: {why} (scripts/setup.sh installs it)", allow_module_level=True)


@pytest.fixture
def hippocampus_root() -> Path:
    if not (HIPPOCAMPUS / "dataset.json").is_file():
        pytest.skip(f"hippocampus data not found at {HIPPOCAMPUS} (the shared MSD Task04 copy)")
    return HIPPOCAMPUS


def run_cli(script: str, args: list[str], cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``python <script> args`` as a user would; returns the finished process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MCSEG_TRACEBACK", None)
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip where CUDA is unusable (scripts/gpu_check.sh runs them on a GPU)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a usable CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Never touch ~/.cache: every test gets its own preprocessing cache."""
    monkeypatch.setenv("MCSEG_CACHE_DIR", str(tmp_path / "cache"))


@contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for the block, then restored."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def one_thread():
    """Tiny tensors on a shared machine: one intra-op thread is faster and steadier."""
    with torch_threads(1):
        yield

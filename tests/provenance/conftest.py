"""The two tiny runs the provenance tests share (issue #12): trained once for the package.

One tiny 2D run (slices across axis 0) and one tiny 3D run on a fake MSD folder, trained once for both test
modules; tests that change a run work on a copy (:func:`copy_run`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcseg.training.checkpoint import save_checkpoint
from mcseg.inference.build import load_checkpoint
from mcseg.evaluate import evaluate
from mcseg.train import train

from ..conftest import compose_config
from ..fake_datasets import write_msd

TINY_MSD = ["dataset=msd", "debug=fast", "model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1",
            "posthoc.fit=[temperature]", "posthoc.apply=[temperature]", "evaluation.bootstrap_samples=10"]
GEOMETRY = {"2d": ["dataset.sampling.slice_axis=0", "dataset.sampling.patch_size=[28,20]"],
            "3d": ["dataset.sampling.dims=3", "dataset.sampling.patch_size=[16,16,16]", "inference.overlap=0.25"]}


@pytest.fixture(scope="package")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("provenance")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCSEG_CACHE_DIR", str(root / "cache"))
        msd_a = write_msd(root / "msd_a", n_cases=6, seed=0)
        msd_b = write_msd(root / "msd_b", n_cases=3, seed=1, prefix="other")
        for kind, geometry in GEOMETRY.items():
            train(compose_config("train", TINY_MSD + [f"dataset.root={msd_a}", *geometry], root / kind))
    return SimpleNamespace(root=root, msd_a=msd_a, msd_b=msd_b, run2d=root / "2d", run3d=root / "3d")


def copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns("tensorboard", "predictions"))
    return dest


def evaluate_with(make_cfg, tmp_path, overrides):
    """Fast settings (temperature scaling only, few resamples, no NIfTI written), then ``overrides``."""
    return evaluate(make_cfg(["evaluation.bootstrap_samples=10", "save_predictions=false",
                              "posthoc.apply=[temperature]", *overrides],
                             config_name="evaluate", output_dir=tmp_path / "job"))


def other_model(best: Path, dest: Path) -> Path:
    """A checkpoint of the same run with other weights (scaled: a different temperature fits it)."""
    state = load_checkpoint(best)
    state["model"] = {k: v * 3 if v.is_floating_point() else v for k, v in state["model"].items()}
    save_checkpoint(dest, state)
    return dest


def read(path: Path) -> dict:
    return json.loads(path.read_text())

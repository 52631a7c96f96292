"""Every experiment preset composes and trains for one tiny step (GUIDE: one test per preset)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import CONFIG_DIR
from tests.data.data_helpers import fake_download

# The study presets (experiment/study/<name>, the studies of scripts/study_pieces.py) train as hippocampus_study:
# tests/test_study_pieces.py composes and validates each and checks its arms and seeds.
PRESETS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
TINY = ["debug=fast", "trainer.max_epochs=1", "trainer.val_max_cases=1", "posthoc.fit=[]", "posthoc.apply=[]",
        "logger.images=0", "evaluation.bootstrap_samples=0", "inference.save_predictions=false"]
# The presets' datasets at fixture size: (fake download or the shared hippocampus copy, tiny overrides)
DATA = {
    "mbls_acdc": ("acdc", ["model.channels=[8,16,32,64,128]", "dataset.sampling.patch_size=[64,64]"]),
    "mbls_flare": ("flare", ["model.channels=[8,16,32,64,128]", "dataset.sampling.patch_size=[32,32]"]),
    "mbls_brats": ("brats", ["model.channels=[8,16,32,64,128]", "dataset.sampling.patch_size=[32,32]"]),
    "mbls_study": ("acdc", ["dataset=acdc", "model.channels=[8,16,32,64,128]", "dataset.sampling.patch_size=[64,64]"]),
    "hippocampus_study": (None, ["model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1"]),
    "hippocampus_cpu": (None, ["model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1",
                               "dataset.sampling.patch_size=[16,16,16]"]),
}
RECIPES = {"hippocampus_cpu"}  # single-run recipes; every other preset is a study sweep


def test_every_preset_has_a_tiny_recipe():
    assert set(PRESETS) == set(DATA), "add the new experiment preset to DATA"


@pytest.mark.parametrize("preset", sorted(set(PRESETS) - RECIPES))
def test_preset_is_a_study_sweep(preset):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={preset}"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("StudySweeper")
    arms = dict(sweeper.arms)
    assert {"ce", "ce_dice", "margin"} <= set(arms)
    assert arms["margin"].startswith("loss=margin loss.margin=")
    assert str(sweeper.params.seed) == "0,1,2"


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_trains_one_tiny_step(preset, make_cfg, tmp_path, request, one_thread):
    from mcseg.train import train

    dataset, extra = DATA[preset]
    if dataset is None:
        root = request.getfixturevalue("hippocampus_root")
        data = [f"dataset.root={root}"]
    else:
        root, data = fake_download(dataset, tmp_path)
        # the preset chooses the dataset and its 2D sampling; keep the fixture's root and sizes
        data = [o for o in data if not o.startswith("dataset=") and "sampling.patch_size" not in o]
    cfg = make_cfg([f"experiment={preset}", *data, *TINY, *extra])
    result = train(cfg)
    assert result["best_epoch"] == 1  # epochs are numbered from 1
    assert 0.0 <= result["test/mean_foreground_dice"] <= 1.0
    assert (tmp_path / "run" / "result.json").is_file()

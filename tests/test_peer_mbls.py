"""scripts/peer_mbls.py's own parts: the slices in the authors' layout, the cap on their epoch and the
rates read from both logs. The authors' code and h5py are not needed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import peer_mbls  # noqa: E402

THEIR_LOG = """\
[2026-12-02 14:18:30,100 INFO][trainer.py:297 - train] - Everything is perfect so far. Let's start training. Good luck!
[2026-12-02 14:18:34,114 INFO][med_trainer.py:73 - log_iter_info] - Train Iter[1/4][1]\t{"data_time": 0.06, "batch_time": 3.7}
[2026-12-02 14:18:37,500 INFO][med_trainer.py:73 - log_iter_info] - Train Iter[2/4][1]\t{"data_time": 0.03, "batch_time": 3.6}
[2026-12-02 14:18:41,500 INFO][med_trainer.py:73 - log_iter_info] - Train Iter[3/4][1]\t{"data_time": 0.03, "batch_time": 4.0}
[2026-12-02 14:18:45,500 INFO][med_trainer.py:73 - log_iter_info] - Train Iter[4/4][1]\t{"data_time": 0.03, "batch_time": 4.0}
[2026-12-02 14:18:46,000 INFO][med_trainer.py:95 - log_epoch_info] - Train Epoch[1]\t{"samples": 128}
"""
MCSEG_LOG = """\
[2026-12-02 14:18:55,179][mcseg.train][INFO] - device: device cpu, cpu_threads 1
[2026-12-02 14:18:59,976][mcseg.training.trainer][INFO] - epoch 1/3 {'train/loss': 1.2181, 'train/lr': 0.001, 'train/samples_per_s': 2.0}
[2026-12-02 14:19:06,132][mcseg.training.trainer][INFO] - epoch 2/3 {'train/loss': 1.1928, 'train/samples_per_s': 8.0}
[2026-12-02 14:19:12,132][mcseg.training.trainer][INFO] - epoch 3/3 {'train/loss': 1.1, 'train/samples_per_s': 4.0, 'val/mean_ece': 0.35}
"""


def test_case_slices_are_centred_in_the_patch_across_the_axis():
    rng = np.random.default_rng(0)
    image = rng.normal(size=(1, 3, 5, 10)).astype(np.float32)  # 1 x X x Y x Z
    label = rng.integers(0, 3, size=(3, 5, 10))
    img, mask = peer_mbls.case_slices(image, label, axis=0, patch=8)
    assert img.shape == mask.shape == (3, 8, 8) and img.dtype == np.float32 and mask.dtype == np.uint8
    # Y = 5 is padded (rows 2..6 of 8), Z = 10 is cropped (columns 1..8 of 10)
    np.testing.assert_array_equal(img[:, 2:7, :], image[0, :, :, 1:9])
    np.testing.assert_array_equal(mask[:, 2:7, :], label[:, :, 1:9])
    assert not img[:, [0, 1, 7]].any() and not mask[:, [0, 1, 7]].any()
    # the authors' HippocampusDataset: volimg = img[None], slice i = volimg[:, i] (1 x H x W)
    assert img[None][:, 2].shape == (1, 8, 8)
    across_last = peer_mbls.case_slices(image, label, axis=2, patch=8)[0]
    assert across_last.shape == (10, 8, 8)
    np.testing.assert_array_equal(across_last[4, 3:6, 2:7], image[0, :, :, 4])


def test_case_slices_refuse_a_multichannel_case():
    with pytest.raises(ValueError, match="1-channel"):
        peer_mbls.case_slices(np.zeros((2, 3, 4, 5)), np.zeros((3, 4, 5)), 0, 8)


def test_timed_split_keeps_every_training_case():
    split = {"train": ["a", "b", "c"], "val": ["d", "e"], "test": ["f", "g"]}
    assert peer_mbls.timed_split(split) == {"train": ["a", "b", "c"], "val": ["d"], "test": ["f"]}


def test_capped_loader_yields_its_first_batches():
    class Loader(list):
        dataset = "the dataset"

    capped = peer_mbls.CappedLoader(Loader(range(10)), 3)
    assert list(capped) == [0, 1, 2] and len(capped) == 3 and capped.dataset == "the dataset"
    assert len(peer_mbls.CappedLoader(Loader(range(2)), 3)) == 2


def test_their_rate_times_the_iterations_after_the_warmup():
    rate, n = peer_mbls.their_rate(THEIR_LOG, batch=32, warmup=2)
    assert n == 2 and rate == pytest.approx(2 * 32 / 8.0)
    with pytest.raises(ValueError, match="none after the warm-up"):
        peer_mbls.their_rate(THEIR_LOG, batch=32, warmup=4)


def test_mcseg_rate_leaves_out_the_first_epoch():
    rate, n = peer_mbls.mcseg_rate(MCSEG_LOG, batch=32, steps_per_epoch=2)
    # epochs 2 and 3: 64 samples each at 8 and 4 samples/s: 128 samples in 24 s
    assert n == 4 and rate == pytest.approx(128 / 24)
    with pytest.raises(ValueError, match="1 epoch line"):
        peer_mbls.mcseg_rate(MCSEG_LOG.splitlines()[1], batch=32, steps_per_epoch=2)


def test_rates_reads_both_sides_runs(tmp_path, capsys):
    for r in (1, 2):
        (tmp_path / "runs" / f"authors-{r}").mkdir(parents=True)
        (tmp_path / "runs" / f"authors-{r}" / "train_net.log").write_text(THEIR_LOG)
        (tmp_path / "runs" / f"mcseg-{r}").mkdir()
        (tmp_path / "runs" / f"mcseg-{r}" / "train.log").write_text(MCSEG_LOG)
        (tmp_path / "runs" / f"mcseg-{r}.out").write_text("console output")
    result = peer_mbls.rates(tmp_path, batch=32, warmup=2)
    assert result["ratio_mcseg_over_authors"] == pytest.approx((128 / 24) / 8.0, rel=1e-3)
    assert json.loads((tmp_path / "rates.json").read_text())["runs"]["mcseg"][1]["timed_steps"] == 4
    out = capsys.readouterr().out
    # one row per pair, saying which side ran first (peer_mbls.sh alternates), with the pair's ratio
    assert "| 1 | authors | 8.00 | 5.33 | 0.667 |" in out and "| 2 | mcseg | 8.00 | 5.33 | 0.667 |" in out

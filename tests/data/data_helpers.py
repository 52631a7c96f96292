"""Helpers shared by the dataset tests."""
from __future__ import annotations

import numpy as np
import torch

# A tiny network and run: a few samples of everything (as TINY_2D in tests/conftest.py).
TINY_RUN = [
    "debug=fast", "logger.images=1", "model.channels=[8,16,32]", "model.strides=[2,2]", "model.num_res_units=1",
    "trainer.max_epochs=1", "trainer.device=cpu", "inference.overlap=0.25",
]


def perfect_probabilities(label: np.ndarray, num_classes: int, multilabel: bool) -> torch.Tensor:
    """The network's output when it predicts the (network-space) label exactly."""
    label = torch.from_numpy(np.asarray(label).astype(np.int64))
    if multilabel:
        return label.float()
    return torch.nn.functional.one_hot(label, num_classes).movedim(-1, 0).float()


def dice_and_hd95(probs: torch.Tensor, label: np.ndarray, spacing, num_classes: int, multilabel: bool):
    """Per foreground class (region) Dice and HD95 in mm, with MONAI's metrics."""
    from monai.metrics import compute_dice, compute_hausdorff_distance

    label = torch.from_numpy(np.asarray(label).astype(np.int64))
    if multilabel:
        pred, ref = (probs > 0.5).float()[None], label.float()[None]
        keep = slice(None)
    else:
        pred = torch.nn.functional.one_hot(probs.argmax(0), num_classes).movedim(-1, 0).float()[None]
        ref = torch.nn.functional.one_hot(label, num_classes).movedim(-1, 0).float()[None]
        keep = slice(1, None)
    dice = compute_dice(pred, ref, include_background=True)[0][keep]
    hd = compute_hausdorff_distance(pred, ref, include_background=True, percentile=95,
                                    spacing=[float(s) for s in spacing])[0][keep]
    return dice.numpy(), hd.numpy()


# ----------------------------------------------------------------------------- fake downloads
def fake_download(name: str, tmp_path):
    """Write dataset ``name`` in its download layout under ``tmp_path``; return ``(root, overrides)``:
    the Hydra overrides of the real preset that make it tiny (sizes only, never the layout)."""
    from tests import fake_datasets as fd

    base = tmp_path / "downloads" / name
    if name == "acdc":
        root = fd.write_acdc(base, n_train=10, n_test=4)
        extra = ["dataset.preprocess.crop_size=[48,48,null]", "dataset.sampling.patch_size=[48,48]"]
    elif name == "flare":
        root = fd.write_flare(base)
        extra = ["dataset.sampling.patch_size=[24,24,12]", "dataset.augment.spatial_prob=1.0"]
    elif name == "brats":
        root = fd.write_brats(base, year=2020)
        extra = ["dataset.sampling.patch_size=[24,24,24]"]
    elif name == "brats_regions":
        root = fd.write_brats(base, year=2021)
        extra = ["dataset.sampling.patch_size=[24,24,24]", "loss=bce"]
    elif name == "brats2019":
        root = fd.write_brats(base, year=2019, n_cases=9)
        name, extra = "brats", ["dataset.sampling.patch_size=[24,24,24]"]
    elif name == "prostate":
        root = fd.write_prostate(base)
        extra = ["dataset.sampling.patch_size=[32,32]"]
    elif name in ("mrbrains", "mrbrains2018"):
        root = fd.write_mrbrains(base, edition=2018 if name.endswith("2018") else 2013)
        name, extra = "mrbrains", ["dataset.sampling.patch_size=[32,32]"]
    elif name in ("nnunet", "nnunet_regions"):
        regions = name.endswith("regions")
        root = fd.write_nnunet(base, regions=regions)
        name, extra = "nnunet", ["dataset.sampling.patch_size=[16,16,8]"] + (["loss=bce"] if regions else [])
    else:
        raise ValueError(name)
    return root, [f"dataset={name}", f"dataset.root={root}", "dataset.preprocess.workers=1"] + extra


ALL_DOWNLOADS = ["acdc", "flare", "brats", "brats_regions", "brats2019", "prostate", "mrbrains", "mrbrains2018",
                 "nnunet", "nnunet_regions"]


def build(make_cfg, overrides):
    """The dataset of the composed training config (as train() builds it)."""
    from mcseg.data.build import build_dataset

    cfg = make_cfg(overrides)
    return build_dataset(cfg.dataset), cfg

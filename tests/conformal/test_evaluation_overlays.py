"""The overlay figures of an evaluation's conformal pass (``conformal.figures``, issue #46 "per case: image,
prediction, the sure and possible masks overlaid") are drawn over the case's image on its file grid, where the
restored probabilities and the masks are, not over a class's probability. No network: an oracle predictor on a
tiny MSD folder whose cases are resampled for the network (so the file grid is not the network's)."""
from __future__ import annotations

import re

import nibabel as nib
import numpy as np
import torch

from mcseg.data.build import build_dataset
from mcseg.evaluation.conformal import ConformalConfig, conformal_of_predictor
from tests.conftest import compose_config
from tests.fake_datasets import write_msd


class Oracle:
    """Logits that favour each voxel's true class (in the network's grid): a predictor without a network."""

    multilabel = False
    device = torch.device("cpu")

    def predict(self, case):
        label = torch.as_tensor(np.asarray(case.label), dtype=torch.long)
        return (4.0 * torch.nn.functional.one_hot(label, 3).movedim(-1, 0).float() - 2.0,)

    def probabilities(self, logits):
        return torch.softmax(logits, 0)


def test_overlay_is_drawn_over_the_cases_image_on_its_file_grid(tmp_path):
    msd = write_msd(tmp_path / "msd", n_cases=5, shape=(16, 18, 8), seed=0)
    cfg = compose_config("train", ["dataset=msd", f"dataset.root={msd}",
                                   "dataset.preprocess.target_spacing=[1.8,1.8,2.5]"], tmp_path / "run")
    dataset = build_dataset(cfg.dataset)
    refs = dataset.case_refs()
    figures = {}
    conformal_of_predictor(ConformalConfig(enabled=True, alpha=0.4, figures=1, masks=False, repeats=0), Oracle(), dataset,
                           refs[:3], dataset, refs[3:], {}, tmp_path / "out", {},
                           log_figure=lambda tag, figure: figures.setdefault(tag, figure))
    case = refs[3].case_id
    assert list(figures) == [f"conformal/raw/{case}"]  # the first conformal.figures test cases
    figure = figures[f"conformal/raw/{case}"]
    image = nib.load(str(msd / "imagesTr" / f"{case}.nii.gz")).get_fdata(dtype=np.float32)
    assert dataset.load(refs[3]).image.shape[1:] != image.shape  # the network's grid is another
    for ax, name in zip(figure.axes, ("crescent", "core")):
        assert ax.get_title().startswith(name)
        index = int(re.search(r"slice (\d+)", ax.get_title()).group(1))
        background = np.asarray(ax.images[0].get_array())
        np.testing.assert_allclose(background, image[..., index].T)  # the image, not the class's probability
    assert "image" in figure._suptitle.get_text()

"""Evaluation under shift (issue #24): the corruptions at each level, their seeds, the label, the scores, the suite."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from mcseg.data.cases import CaseData
from mcseg.data.shift import KINDS, CorruptionSpec, case_seed, corruption, shift_config
from mcseg.data.synthetic import SyntheticDataset
from mcseg.errors import ConfigError
from mcseg.metrics.robustness import level_weights, robustness, suite_robustness

from .conftest import CONFIG_DIR

SUITES = {name: shift_config(OmegaConf.load(Path(CONFIG_DIR) / "shift" / f"{name}.yaml")) for name in ("rood_mri", "ct")}
ROOD = SUITES["rood_mri"]

# ROOD-MRI's levels 1..5 (shared/reference/uncertainty_and_shift.md, C2; roodmri/transforms/defaults.py), written out
# by hand: (corruption, the transform's attribute, its value at each level)
ROOD_TABLE = [
    ("affine", "degrees", [(-x, x) * 3 for x in (6, 12, 18, 24, 30)]),
    ("affine", "translation", [(-x, x) * 3 for x in (8, 16, 24, 32, 40)]),
    ("affine", "scales", [(1, 1) * 3] * 5),
    ("aniso_downsample", "downsampling_range", [(x, x) for x in (2.8, 4.6, 6.4, 8.2, 10.0)]),
    ("aniso_downsample", "axes", [(0, 1, 2)] * 5),
    ("bias_field", "coefficients_range", [(-x, x) for x in (0.3, 0.6, 0.9, 1.2, 1.5)]),
    ("bias_field", "order", [3] * 5),
    ("contrast_compression", "gamma", [0.86, 0.72, 0.58, 0.44, 0.30]),
    ("contrast_expansion", "gamma", [1.4, 1.8, 2.2, 2.6, 3.0]),
    ("elastic_deformation", "max_displacement", [(x, x, x) for x in (6, 12, 18, 24, 30)]),
    ("elastic_deformation", "num_control_points", [(7, 7, 7)] * 5),
    ("ghosting", "num_ghosts_range", [(x, x) for x in (3, 5, 7, 9, 11)]),
    ("ghosting", "intensity_range", [(x, x) for x in (0.5, 1.0, 1.5, 2.0, 2.5)]),
    ("ghosting", "axes", [(0, 1)] * 5),
    ("motion", "degrees_range", [(-x, x) for x in (1, 2, 3, 4, 5)]),
    ("motion", "translation_range", [(-x, x) for x in (2, 4, 6, 8, 10)]),
    ("motion", "num_transforms", [2, 4, 6, 8, 10]),
    ("rician_noise", "std", [0.16, 0.32, 0.48, 0.64, 0.80]),
    ("rician_noise", "sample_std", [False] * 5),
    ("rician_noise", "relative", [True] * 5),
    ("rician_noise", "channel_wise", [True] * 5),
    ("rician_noise", "prob", [1.0] * 5),
    ("smoothing", "std", [(x, x, x) for x in (0.8, 1.6, 2.4, 3.2, 4.0)]),
]
CT_TABLE = [
    ("noise", "std", [15, 26, 40, 58, 84]), ("noise", "sample_std", [False] * 5), ("noise", "prob", [1.0] * 5),
    ("smoothing", "std", [(x, x, x) for x in (0.5, 1.0, 1.5, 2.0, 2.5)]),
    ("low_resolution", "downsampling_range", [(x, x) for x in (1.5, 2.0, 3.0, 4.0, 5.0)]),
    ("low_resolution", "axes", [(2,)] * 5),
    ("window_shift", "offset", [10, 20, 40, 60, 80]),
]


def _attr(transform, name):
    if name == "gamma" and hasattr(transform, "gamma"):
        return transform.gamma
    value = getattr(transform, name)
    return tuple(float(v) for v in value) if isinstance(value, (tuple, list)) and name != "axes" else value


@pytest.mark.parametrize("suite,table", [("rood_mri", ROOD_TABLE), ("ct", CT_TABLE)])
def test_every_corruption_builds_the_reference_parameters_at_each_level(suite, table):
    cfg = SUITES[suite]
    assert {name for name, _, _ in table} == set(cfg.corruptions) == set(cfg.definitions)
    assert cfg.levels == [1, 2, 3, 4, 5] and cfg.alpha == pytest.approx(2 / 3)
    for name, attr, values in table:
        for level, want in enumerate(values, 1):
            transform = corruption(name, cfg.definitions[name], level).transform(dims=3)
            got = _attr(transform, attr)
            want = tuple(float(v) for v in want) if isinstance(want, tuple) and attr != "axes" else want
            assert got == pytest.approx(want), (name, level, attr, got, want)


def test_rood_mri_uses_monai_where_it_has_the_transform_and_torchio_otherwise():
    libraries = {name: KINDS[ROOD.definitions[name].kind].library for name in ROOD.corruptions}
    assert {n for n, lib in libraries.items() if lib == "monai"} == {"contrast_compression", "contrast_expansion",
                                                                       "rician_noise"}
    moves = {n for n in ROOD.corruptions if KINDS[ROOD.definitions[n].kind].geometric}
    assert moves == {"affine", "elastic_deformation"}


def _case(shape=(16, 16, 16), spacing=(1.0, 1.0, 1.5)) -> CaseData:
    data = SyntheticDataset(shape=shape, n_cases=3, spacing=spacing)
    return data.read(data.case_refs()[0])


@pytest.mark.parametrize("name", ROOD.corruptions + [f"ct:{n}" for n in SUITES["ct"].corruptions])
def test_the_same_seed_gives_the_same_case_bit_for_bit_and_leaves_the_callers_generators_alone(name):
    suite = SUITES["ct"] if name.startswith("ct:") else ROOD
    name = name.removeprefix("ct:")
    case = _case()
    if suite is SUITES["ct"]:
        case.image = case.image * 1000 - 1000  # HU-like
    c = corruption(name, suite.definitions[name], 3)
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    a, drawn_a = c(case, 1234)
    b, drawn_b = c(case, 1234)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert a.image.tobytes() == b.image.tobytes() and a.label.tobytes() == b.label.tobytes()
    assert drawn_a == drawn_b and drawn_a["seed"] == 1234
    assert a.image.dtype == np.float32 and a.image.shape == case.image.shape and np.isfinite(a.image).all()
    assert not np.array_equal(a.image, case.image)
    other, _ = c(case, 99)
    random = name not in ("contrast_compression", "contrast_expansion", "smoothing", "window_shift") and \
        not (name == "low_resolution")  # one axis and one factor: nothing is drawn
    assert (other.image.tobytes() != a.image.tobytes()) == random


def test_case_seeds_are_stable_and_differ_by_case_corruption_and_level():
    assert case_seed(0, "hippocampus_001", "ghosting", 3) == case_seed(0, "hippocampus_001", "ghosting", 3)
    assert case_seed(0, "hippocampus_001", "ghosting", 3) == 2010923612  # sha256-derived: the same on any machine
    seeds = {case_seed(s, c, n, lv) for s in (0, 1) for c in ("a", "b") for n in ("ghosting", "motion")
             for lv in (1, 2)}
    assert len(seeds) == 16 and all(0 <= s < 2 ** 31 for s in seeds)


@pytest.mark.parametrize("name", ["affine", "elastic_deformation"])
def test_geometric_corruptions_move_the_label_with_the_image_by_nearest_neighbour(name):
    label = np.zeros((32, 32, 32), np.int64)
    label[6:26, 6:26, 6:26] = 2  # classes 0 and 2 touch: linear interpolation would make 1s at their border
    label[12:20, 12:20, 12:20] = 4
    case = CaseData("c", (label[None] * 100.0).astype(np.float32), label, (1.0, 1.0, 1.0), np.eye(4))
    c = corruption(name, ROOD.definitions[name], 1)  # 6 degrees and 8 mm; 6 mm displacements
    out, drawn = c(case, 5)
    assert out.label.dtype == label.dtype and out.label.shape == label.shape
    assert set(np.unique(out.label)) <= {0, 2, 4}
    assert (out.label != label).sum() > 50  # it moved
    # the image went the same way: the structures of its (linearly interpolated) intensities are the moved label's
    def dice(a, b):
        return 2 * (a & b).sum() / (a.sum() + b.sum())

    assert dice(out.label > 0, out.image[0] > 100) > 0.95
    assert dice(out.label == 4, out.image[0] > 300) > 0.85
    assert drawn["applied"][0]["transform"] in ("Affine", "ElasticDeformation")


def test_a_region_label_moves_with_every_region():
    case = _case()
    masks = np.zeros((2, 16, 16, 16), np.uint8)
    masks[0, 2:14, 2:14, 2:14] = 1
    masks[1, 5:9, 5:9, 5:9] = 1
    case.label = masks
    out, _ = corruption("affine", ROOD.definitions["affine"], 3)(case, 11)
    assert out.label.shape == masks.shape and out.label.dtype == np.uint8 and set(np.unique(out.label)) <= {0, 1}
    assert not np.array_equal(out.label, masks)


@pytest.mark.parametrize("name", [n for n in ROOD.corruptions if n not in ("affine", "elastic_deformation")])
def test_intensity_corruptions_leave_the_label_untouched(name):
    case = _case()
    out, _ = corruption(name, ROOD.definitions[name], 5)(case, 3)
    assert out.label is case.label or np.array_equal(out.label, case.label)
    assert out.label.dtype == case.label.dtype


def test_ghosting_and_motion_clip_negatives_and_rician_noise_scales_with_the_image_std():
    case = _case()
    for name in ("ghosting", "motion"):
        out, _ = corruption(name, ROOD.definitions[name], 5)(case, 1)
        assert out.image.min() >= 0
    big = CaseData(case.case_id, np.full((1, 32, 32, 32), 5.0, np.float32), case.label, case.spacing, case.affine)
    big.image[0, :16] = 15.0  # image std 5
    out, _ = corruption("rician_noise", ROOD.definitions["rician_noise"], 1)(big, 0)
    # Rician: sqrt((x + n1)^2 + n2^2) with std 0.16 x 5 = 0.8; for x >> std the spread is about the std
    assert np.std(out.image[0, 16:] - 5.0) == pytest.approx(0.8, rel=0.1)


@pytest.mark.parametrize("name", ROOD.corruptions)
def test_2d_cases_keep_their_shape(name):
    case = _case(shape=(32, 32), spacing=(1.0, 1.0))
    out, _ = corruption(name, ROOD.definitions[name], 3)(case, 2)
    assert out.image.shape == case.image.shape and out.label.shape == case.label.shape
    assert np.issubdtype(out.label.dtype, np.integer)


def test_the_corruption_acts_on_the_raw_case_before_normalisation():
    data = SyntheticDataset(shape=(16, 16, 16), n_cases=3)  # z-score per case
    ref = data.case_refs()[0]
    clean = data.load(ref)
    shift = CorruptionSpec(kind="shift", levels={"offset": [40.0]})
    offset = corruption("offset", shift, 1)
    shifted = data.corrupted(lambda case: offset(case, 0)[0]).load(ref)
    np.testing.assert_allclose(shifted.image, clean.image, atol=1e-4)  # z-score removes an offset of the raw image
    noisy = data.corrupted(lambda case: corruption("r", ROOD.definitions["rician_noise"], 5)(case, 0)[0]).load(ref)
    assert abs(noisy.image.mean()) < 1e-4 and noisy.image.std() == pytest.approx(1, abs=1e-3)
    assert not np.allclose(noisy.image, clean.image)
    assert data.corruption is None and np.array_equal(data.load(ref).image, clean.image)  # the dataset is untouched


def test_a_suite_refuses_unknown_corruptions_levels_and_parameters():
    node = OmegaConf.load(Path(CONFIG_DIR) / "shift" / "rood_mri.yaml")
    with pytest.raises(ConfigError, match="blur_typo"):
        shift_config(OmegaConf.merge(node, {"corruptions": ["blur_typo"]}))
    with pytest.raises(ConfigError, match="shift.levels"):
        shift_config(OmegaConf.merge(node, {"levels": [6]}))
    with pytest.raises(ConfigError, match="sigma"):
        shift_config(OmegaConf.merge(node, {"definitions": {"smoothing": {"levels": {"sigma": [1, 2, 3, 4, 5]}}}}))
    assert shift_config(OmegaConf.merge(node, {"levels": [0, 3, 1]})).levels == [1, 3]


# ------------------------------------------------------------------------------------------------ the scores
def test_robustness_scores_against_hand_computed_values():
    assert level_weights([1, 2, 3]) == pytest.approx({1: 2 / 3, 2: 4 / 9, 3: 8 / 27})
    # Dice 0.9 clean, 0.8 and 0.6 at levels 1 and 2: w = 2/3, 4/9 (sum 10/9)
    dice = robustness({0: 0.9, 1: 0.8, 2: 0.6}, higher_is_better=True)
    assert dice["overall"] == pytest.approx((0.9 + 2 / 3 * 0.8 + 4 / 9 * 0.6) / (1 + 10 / 9))  # 15.3 / 19
    assert dice["overall"] == pytest.approx(0.8052631578947368)
    assert dice["degradation"] == pytest.approx(0.18)  # (2/3 * 0.1 + 4/9 * 0.3) / (10/9)
    ece = robustness({0: 0.05, 1: 0.1, 2: 0.2}, higher_is_better=False)
    assert ece["overall"] == pytest.approx(1.85 / 19)
    assert ece["degradation"] == pytest.approx(0.09)  # worse is positive for lower-is-better metrics too
    suite = suite_robustness({"a": {0: 0.9, 1: 0.8, 2: 0.6}, "b": {0: 0.9, 1: 0.9, 2: 0.9}}, True)
    assert suite["overall"] == pytest.approx((15.3 / 19 + 0.9) / 2)
    assert suite["degradation"] == pytest.approx(0.09) and suite["corruptions_scored"] == 2
    missing = suite_robustness({"a": {0: 3.0, 1: float("nan")}, "b": {0: 2.0, 1: 4.0}}, False)
    assert missing["per_corruption"]["a"] == {"overall": None, "degradation": None}
    assert missing["degradation"] == pytest.approx(2.0) and missing["corruptions_scored"] == 1

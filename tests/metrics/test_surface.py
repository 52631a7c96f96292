"""Surface distances in mm: HD (both definitions) and ASSD, empty policy, MONAI agreement."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.ndimage import binary_erosion, distance_transform_edt

from mcseg.metrics.empty import StructureStatus
from mcseg.metrics.surface import (
    SurfaceDistanceMetric,
    boundary_mask,
    directed_distances,
    surface_distances,
    surface_points,
)

from .reference import blobs


def _pair(shape, label_voxels, pred_voxels):
    label, pred = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
    for v in label_voxels:
        label[v] = 1
    for v in pred_voxels:
        pred[v] = 1
    return pred, label


@pytest.mark.parametrize(("spacing", "expected"), [((1.0, 1.0), 3.0), ((1.0, 2.0), 6.0), ((2.0, 1.0), 3.0)])
def test_single_voxels_three_columns_apart(spacing, expected):
    pred, label = _pair((6, 8), [(2, 2)], [(2, 5)])
    out = surface_distances(pred, label, 2, spacing)
    assert out.hd[1].item() == pytest.approx(expected) and out.assd[1].item() == pytest.approx(expected)
    assert math.isnan(out.hd[0].item()) and out.status[0] is None  # background is not evaluated


def test_percentile_definitions_by_hand():
    # label: row 5, columns 1..4; prediction: the same plus a stray voxel at column 8.
    # d(P -> L) = [0, 0, 0, 0, 4], d(L -> P) = [0, 0, 0, 0]
    pred, label = _pair((10, 10), [(5, c) for c in range(1, 5)], [(5, c) for c in (1, 2, 3, 4, 8)])
    directed = surface_distances(pred, label, 2, (1.0, 1.0), 95.0, "max_directed")
    pooled = surface_distances(pred, label, 2, (1.0, 1.0), 95.0, "pooled")
    full = surface_distances(pred, label, 2, (1.0, 1.0), 100.0)
    assert directed.hd[1].item() == pytest.approx(3.2)  # P95 of 5 values: 0.8 of the way from 0 to 4
    assert pooled.hd[1].item() == pytest.approx(2.4)  # P95 of 9 values: 0.6 of the way from 0 to 4
    assert full.hd[1].item() == pytest.approx(4.0)
    assert directed.assd[1].item() == pytest.approx(4 / 9) == pooled.assd[1].item()


@pytest.mark.parametrize(("spacing", "expected"), [((1.0, 1.0, 1.0), 1.0), ((0.5, 0.7, 3.0), 3.0),
                                                    ((2.0, 2.0, 0.25), 0.25)])
def test_anisotropic_spacing_scales_a_shift_along_z(spacing, expected):
    # one-voxel-thick planes at z = 2 and z = 3: every surface voxel faces its partner across z
    label, pred = torch.zeros(10, 10, 6, dtype=torch.long), torch.zeros(10, 10, 6, dtype=torch.long)
    label[2:8, 2:8, 2] = 1
    pred[2:8, 2:8, 3] = 1
    out = surface_distances(pred, label, 2, spacing)
    assert out.hd[1].item() == pytest.approx(expected) and out.assd[1].item() == pytest.approx(expected)


def test_empty_structures_follow_the_policy():
    # K = 4 on a 10 x 12 image with spacing (1, 2): diagonal sqrt(10^2 + 24^2) = 26 mm
    label = torch.zeros(10, 12, dtype=torch.long)
    pred = torch.zeros(10, 12, dtype=torch.long)
    label[2:4, 2:4] = 1  # class 1 missed
    pred[6:8, 6:8] = 2  # class 2 false alarm; class 3 absent from both
    out = surface_distances(pred, label, 4, (1.0, 2.0))
    assert out.hd[1].item() == 26.0 and out.assd[1].item() == 26.0
    assert out.hd[2].item() == 26.0 and out.assd[2].item() == 26.0
    assert math.isnan(out.hd[3].item()) and math.isnan(out.assd[3].item())
    assert out.status[1:] == [StructureStatus.MISSED, StructureStatus.FALSE_ALARM, StructureStatus.BOTH_EMPTY]


def test_surface_is_monai_edge_definition():
    label = blobs((20, 18, 14), 3, seed=3)
    points = surface_points(label, 3, (1.0, 1.0, 1.0))
    for k in (1, 2):
        mask = (label == k).numpy()
        edge = mask ^ binary_erosion(mask)  # cross structuring element, zero border (MONAI get_mask_edges)
        assert {tuple(p) for p in points[k]} == {tuple(p) for p in np.argwhere(edge).astype(float)}
        assert len(points[k]) == edge.sum() > 0
    border = boundary_mask(torch.zeros(4, 5, dtype=torch.long))
    assert border.sum().item() == 4 * 5 - 2 * 3  # only the image border


def test_kdtree_distances_equal_the_distance_transform():
    label = blobs((22, 20, 12), 2, seed=4)
    pred = blobs((22, 20, 12), 2, seed=5)
    spacing = (0.8, 1.1, 2.5)
    p, y = surface_points(pred, 2, spacing)[1], surface_points(label, 2, spacing)[1]
    target = np.zeros(label.shape, dtype=bool)
    target[tuple(np.round(y / spacing).astype(int).T)] = True
    edt = distance_transform_edt(~target, sampling=spacing)
    np.testing.assert_allclose(directed_distances(p, y), edt[tuple(np.round(p / spacing).astype(int).T)], atol=1e-9)


def _monai_onehot(t, k):
    return torch.nn.functional.one_hot(t, k).movedim(-1, 0)[None].float()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # MONAI's own deprecation inside get_mask_edges
@pytest.mark.parametrize(("shape", "spacing"), [((40, 36, 24), (0.9, 1.2, 2.5)), ((64, 48), (0.7, 1.3))])
def test_agrees_with_monai_hd95_and_assd(shape, spacing):
    from monai.metrics import compute_average_surface_distance, compute_hausdorff_distance

    label, pred = blobs(shape, 4, seed=6), blobs(shape, 4, seed=7)
    ours = surface_distances(pred, label, 4, spacing, 95.0, "max_directed")
    hd = compute_hausdorff_distance(_monai_onehot(pred, 4), _monai_onehot(label, 4), percentile=95, spacing=spacing)
    assd = compute_average_surface_distance(_monai_onehot(pred, 4), _monai_onehot(label, 4), symmetric=True,
                                            spacing=spacing)
    np.testing.assert_allclose(ours.hd[1:].numpy(), hd[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(ours.assd[1:].numpy(), assd[0].numpy(), rtol=1e-6)


def test_metric_class_aggregates():
    metric = SurfaceDistanceMetric(num_classes=2)
    metric(*_pair((6, 8), [(2, 2)], [(2, 5)]), spacing=(1.0, 1.0))
    metric(*_pair((6, 8), [(2, 2)], [(2, 3)]), spacing=(1.0, 1.0))
    metric(*_pair((6, 8), [], []), spacing=(1.0, 1.0))
    out = metric.aggregate()
    assert out["hd"][1].item() == pytest.approx(2.0) and out["status_counts"]["both_empty"][1] == 1


def test_multilabel_regions():
    label = torch.zeros(2, 8, 8, dtype=torch.bool)
    pred = torch.zeros(2, 8, 8, dtype=torch.bool)
    label[0, 2, 2] = pred[0, 2, 4] = True  # region 0: 2 voxels apart; region 1 empty in both
    out = surface_distances(pred, label, 2, (1.0, 1.5), multilabel=True)
    assert out.hd[0].item() == pytest.approx(3.0) and out.status[1] is StructureStatus.BOTH_EMPTY


def test_bad_arguments_are_refused():
    pred, label = _pair((6, 8), [(2, 2)], [(2, 5)])
    with pytest.raises(ValueError, match="hd_definition"):
        surface_distances(pred, label, 2, (1.0, 1.0), definition="medpy")
    with pytest.raises(ValueError, match="spacing"):
        surface_distances(pred, label, 2, (1.0, 1.0, 1.0))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), shift=st.tuples(st.integers(-6, 6), st.integers(-6, 6)),
       spacing=st.tuples(st.floats(0.3, 3.0), st.floats(0.3, 3.0)), q=st.sampled_from([50.0, 95.0, 100.0]))
def test_property_hd_invariant_to_translating_both_maps(seed, shift, spacing, q):
    small_label, small_pred = blobs((24, 24), 3, seed=seed), blobs((24, 24), 3, seed=seed + 1)
    canvas = lambda t, dx, dy: torch.nn.functional.pad(t, (8 + dy, 8 - dy, 8 + dx, 8 - dx))  # noqa: E731
    a = surface_distances(canvas(small_pred, 0, 0), canvas(small_label, 0, 0), 3, spacing, q)
    b = surface_distances(canvas(small_pred, *shift), canvas(small_label, *shift), 3, spacing, q)
    defined = ~a.hd.isnan()
    torch.testing.assert_close(a.hd[defined], b.hd[defined])
    torch.testing.assert_close(a.assd[defined], b.assd[defined])
    # and symmetric in (prediction, label) for the max of directed percentiles
    c = surface_distances(canvas(small_label, 0, 0), canvas(small_pred, 0, 0), 3, spacing, q)
    torch.testing.assert_close(a.hd[defined], c.hd[defined])


def test_surface_points_on_both_surfaces_are_zero_without_a_query_and_change_no_distance():
    """A point of the prediction's surface that is also on the label's (the same voxel) is at distance exactly 0:
    surface_distances does not query the k-d tree for it. Every distance, HD and ASSD stays that of querying all."""
    label = blobs((24, 20, 16), 3, seed=5)
    pred = label.clone()
    pred[5:9, 4:12, 3:8] = 2  # a part moved: some surface voxels shared, some not
    spacing = (0.8, 0.7, 2.5)
    p_all, y_all = surface_points(pred, 3, spacing), surface_points(label, 3, spacing)
    for k in (1, 2):
        p, y = p_all[k], y_all[k]
        shared = (p[:, None, :] == y[None, :, :]).all(-1).any(1)
        assert 0 < shared.sum() < len(p)
        queried = directed_distances(p, y)
        assert np.array_equal(directed_distances(p, y, shared), queried)
        assert np.array_equal(queried == 0, shared)
    out = surface_distances(pred, label, 3, spacing)
    for k in (1, 2):
        d_pl, d_lp = directed_distances(p_all[k], y_all[k]), directed_distances(y_all[k], p_all[k])
        assert out.hd[k].item() == max(np.percentile(d_pl, 95), np.percentile(d_lp, 95))
        assert out.assd[k].item() == (d_pl.sum() + d_lp.sum()) / (d_pl.size + d_lp.size)


@pytest.mark.parametrize("dims", [2, 3])
def test_direct_distances_have_the_k_d_tree_bits(dims):
    """nearest_direct (every pair computed, what a small query gets) returns the very bits of scipy's k-d tree on
    grid points with anisotropic spacings, in chunks of rows (a target larger than a chunk's row) and not."""
    from scipy.spatial import cKDTree

    from mcseg.metrics.surface import nearest_direct

    rng = np.random.default_rng(7)
    for n_source, n_target in [(1, 1), (37, 5), (400, 900), (3, 70_000)]:
        for spacing in (np.ones(dims), rng.uniform(0.3, 3.0, dims), np.array([0.7, 0.7, 2.5][:dims])):
            source = rng.integers(0, 64, (n_source, dims)) * spacing
            target = rng.integers(0, 64, (n_target, dims)) * spacing
            expected = cKDTree(target, leafsize=32).query(source, k=1)[0]
            assert np.array_equal(nearest_direct(source, target), expected)


def test_directed_distances_are_the_same_whichever_way_answers(monkeypatch):
    """A small query is answered directly while the process's budget lasts and scipy.spatial is not imported,
    then by the k-d tree: the same distances; a query larger than DIRECT_MAX_PAIRS always goes to the tree."""
    import mcseg.metrics.surface as surface

    monkeypatch.setattr(surface, "_tree_imported", lambda: False)

    label = blobs((24, 20, 16), 3, seed=5)
    pred = blobs((24, 20, 16), 3, seed=6)
    spacing = (0.8, 0.7, 2.5)
    p, y = surface_points(pred, 3, spacing)[1], surface_points(label, 3, spacing)[1]
    monkeypatch.setattr(surface, "_direct_left", surface.DIRECT_BUDGET)
    direct = directed_distances(p, y)
    assert surface._direct_left == surface.DIRECT_BUDGET - len(p) * len(y)
    monkeypatch.setattr(surface, "_direct_left", 0)
    assert np.array_equal(directed_distances(p, y), direct)
    monkeypatch.setattr(surface, "_direct_left", surface.DIRECT_BUDGET)
    monkeypatch.setattr(surface, "DIRECT_MAX_PAIRS", len(p) * len(y) - 1)
    assert np.array_equal(directed_distances(p, y), direct)
    assert surface._direct_left == surface.DIRECT_BUDGET
    monkeypatch.setattr(surface, "DIRECT_MAX_PAIRS", len(p) * len(y))
    monkeypatch.setattr(surface, "_tree_imported", lambda: True)  # the import is paid: the tree answers
    assert np.array_equal(directed_distances(p, y), direct)
    assert surface._direct_left == surface.DIRECT_BUDGET


def test_scoring_small_cases_does_not_import_scipy_spatial():
    """Importing scipy.spatial costs a process more than the surface distances of a folder of small cases
    (#58): HD95 and ASSD of a hippocampus-sized case leave it unimported (before: imported at the first case)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, torch
        from mcseg.metrics.surface import surface_distances
        z, y, x = torch.meshgrid(*(torch.arange(n) for n in (36, 50, 35)), indexing="ij")
        label = ((z - 18) ** 2 + (y - 25) ** 2 + (x - 17) ** 2 < 100).long()  # a hippocampus-sized structure
        label[(z - 18) ** 2 + (y - 32) ** 2 + (x - 17) ** 2 < 16] = 2
        pred = label.roll((1, 2), (0, 1))
        out = surface_distances(pred, label, 3, (1.0, 1.0, 1.0))
        assert torch.isfinite(out.hd[1:]).all()
        print("scipy.spatial" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

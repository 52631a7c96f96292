"""The post-hoc scaler interface (mcseg.calibration.scaler_registry) and local temperature scaling (mcseg.calibration.lts)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from mcseg.calibration.lts import HALO, CaseLogits, LTSConfig, LTSNet, load_lts, save_lts
from mcseg.calibration.scaler_registry import SCALER_TYPES, FitData, LTSScaler, build_scaler, load_scaler
from mcseg.metrics.overlap import dice
from tests.test_calibration import calibrated_logits


def smooth_logits(k: int, shape: tuple[int, ...], g: torch.Generator, std: float = 2.5) -> torch.Tensor:
    """Spatially smooth random logits ``K x *S`` (neighbouring voxels agree, as a network's do)."""
    x = torch.randn((1, k, *shape), generator=g)
    pool = F.avg_pool2d if len(shape) == 2 else F.avg_pool3d
    for _ in range(2):
        x = pool(x, 5, stride=1, padding=2, count_include_pad=False)
    return (x / x.std() * std)[0]


def half_and_half_cases(n: int, shape: tuple[int, ...], k: int = 3, seed: int = 0) -> list[CaseLogits]:
    """Cases of a calibrated model (labels drawn from softmax(z*)) whose logits were then flattened
    on the left half (z = 0.5 z*, true T = 0.5) and sharpened on the right (z = 2 z*, true T = 2);
    the image is 0 on the left, 1 on the right."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for i in range(n):
        z_star = smooth_logits(k, shape, g)
        y = torch.multinomial(torch.softmax(z_star, 0).movedim(0, -1).reshape(-1, k), 1, generator=g).reshape(shape)
        right = (torch.arange(shape[-1]) >= shape[-1] // 2).expand(shape)
        t = torch.where(right, 2.0, 0.5)
        cases.append(CaseLogits(f"case{i}", (z_star * t).numpy(), y.numpy(), right[None].float().numpy()))
    return cases


def random_net(k: int, dims: int, image_channels: int = 0, seed: int = 0) -> LTSNet:
    torch.manual_seed(seed)
    net = LTSNet(k, image_channels, dims)
    for p in net.parameters():
        p.data.normal_(0, 0.3)
    return net.eval()


# ------------------------------------------------------------------ the interface
def test_every_scaler_is_registered_under_its_name():
    from mcseg.calibration.fiducio_adapters import FIDUCIO_SCALERS

    assert set(SCALER_TYPES) == {"temperature", "vector", "lts", "histogram", "histogram_top", "isotonic", "isotonic_top",
                                 *(o.name for o in FIDUCIO_SCALERS)}
    with pytest.raises(ValueError, match="'bogus'"):
        build_scaler("bogus")


@pytest.mark.parametrize("true_t", [3.0, 0.5])
def test_temperature_scaler_recovers_a_global_temperature(tmp_path, true_t):
    z, y = calibrated_logits(100_000, 4, seed=3)
    scaler = build_scaler("temperature")
    record = scaler.fit(FitData(voxels=(z * true_t, y)))
    assert record["temperature"] == pytest.approx(true_t, rel=0.03)
    # applied to one case's channels-first logits: z / T, arg-max unchanged
    case = torch.randn(4, 5, 6, 7) * 3
    assert torch.allclose(scaler.apply(case), case / record["temperature"])
    assert torch.equal(scaler.apply(case).argmax(0), case.argmax(0))
    # save -> JSON -> load gives the same scaler
    saved = json.loads(json.dumps(scaler.save(tmp_path)))
    again = load_scaler("temperature", saved, tmp_path)
    assert torch.equal(again.apply(case), scaler.apply(case))
    assert "T=" in again.describe()


def test_vector_scaler_round_trip(tmp_path):
    z, y = calibrated_logits(20_000, 3, seed=4)
    scaler = build_scaler("vector")
    scaler.fit(FitData(voxels=(z * torch.tensor([0.5, 1.0, 2.0]), y)))
    case = torch.randn(3, 4, 5)
    again = load_scaler("vector", json.loads(json.dumps(scaler.save(tmp_path))), tmp_path)
    assert torch.allclose(again.apply(case), scaler.apply(case))


def test_scalers_say_what_they_need():
    with pytest.raises(ValueError, match="voxel sample"):
        build_scaler("temperature").fit(FitData(cases=[]))
    with pytest.raises(ValueError, match="whole validation cases"):
        build_scaler("lts").fit(FitData(voxels=(torch.zeros(1, 2), torch.zeros(1))))


# ------------------------------------------------------------------ LTS
@pytest.mark.slow
@pytest.mark.parametrize("dims,shape,patch", [(2, (8, 48, 48), [48, 48]), (3, (24, 24, 24), [24, 24, 24])])
def test_lts_recovers_a_spatially_varying_temperature(tmp_path, dims, shape, patch):
    """T = 0.5 on the left half, 2 on the right, learnt from the logits and the image (2D slices / 3D patches
    from the training sampler, early stopping on a held-out case); save/load keeps it."""
    cases = half_and_half_cases(5, shape)
    cfg = LTSConfig(dims=dims, patch_size=patch, batch_size=4 if dims == 2 else 1, use_image=True, lr=0.05,
                    steps_per_epoch=10, max_epochs=15, patience=3, slice_axis=0)
    scaler = LTSScaler(cfg)
    record = scaler.fit(FitData(cases=cases))
    assert record["nll_after"] < record["nll_before"] - 0.05
    assert len(record["heldout_cases"]) == 1 and record["heldout_cases"][0] not in record["train_cases"]
    z, image = torch.as_tensor(cases[0].logits), torch.as_tensor(cases[0].image)
    t = scaler.net.temperature_map(z, image, slice_axis=0)
    w = shape[-1]
    left, right = t[..., : w // 2 - HALO], t[..., w // 2 + HALO:]  # away from the border between the halves
    assert left.median().item() == pytest.approx(0.5, rel=0.1)
    assert right.median().item() == pytest.approx(2.0, rel=0.1)
    calibrated = scaler.apply(z, image)
    assert torch.equal(calibrated.argmax(0), z.argmax(0))
    saved = json.loads(json.dumps(scaler.save(tmp_path)))
    assert (tmp_path / saved["weights"]).is_file()
    again = load_scaler("lts", saved, tmp_path)
    assert torch.equal(again.apply(z, image), calibrated)
    assert "lts (" in again.describe()


@pytest.mark.parametrize("dims,shape", [(2, (7, 12, 9)), (3, (9, 10, 23)), (2, (13, 11))])
def test_lts_leaves_the_argmax_and_dice_unchanged(dims, shape):
    """Any LTS net (random weights) divides all K logits of a voxel by one T > 0: same arg-max, same Dice."""
    g = torch.Generator().manual_seed(5)
    z = torch.randn(4, *shape, generator=g) * 4
    label = torch.randint(0, 4, shape, generator=g)
    net = random_net(4, dims)
    t = net.temperature_map(z, chunk=3)
    assert t.shape == shape and bool((t >= net.floor).all())
    assert not torch.allclose(t, t.flatten()[0].expand_as(t))  # really local
    zc = net.apply(z, chunk=3)
    assert torch.equal(zc.argmax(0), z.argmax(0))
    torch.testing.assert_close(dice(zc.argmax(0), label, 4), dice(z.argmax(0), label, 4), equal_nan=True)


@pytest.mark.parametrize("dims,shape", [(3, (6, 7, 20)), (2, (5, 9, 8))])
def test_lts_in_chunks_equals_the_whole_volume(dims, shape):
    g = torch.Generator().manual_seed(6)
    z = torch.randn(3, *shape, generator=g)
    image = torch.randn(2, *shape, generator=g)
    net = random_net(3, dims, image_channels=2)
    whole = net.temperature_map(z, image, chunk=1000)
    for chunk in (1, 3, 7):
        torch.testing.assert_close(net.temperature_map(z, image, chunk=chunk), whole)
    if dims == 3:  # and equals one pass of the network over the volume
        torch.testing.assert_close(whole, net(z[None], image[None])[0, 0])


def test_lts_starts_at_the_identity():
    net = LTSNet(3, 1, 2)
    z = torch.randn(3, 6, 8, 8) * 5
    torch.testing.assert_close(net.apply(z, torch.randn(1, 6, 8, 8)), z)


def test_lts_weights_load_with_weights_only_and_are_checked(tmp_path):
    net = random_net(3, 3, image_channels=1)
    path = tmp_path / "lts.pt"
    sha = save_lts(net, path)
    again = load_lts(path, sha)
    z, image = torch.randn(3, 5, 6, 7), torch.randn(1, 5, 6, 7)
    assert torch.equal(again.apply(z, image), net.apply(z, image))
    with pytest.raises(ValueError, match="sha256"):
        load_lts(path, "0" * 64)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not an LTS weights file"):
        load_lts(path)
    with pytest.raises(OSError, match="not found"):
        load_lts(tmp_path / "missing.pt")


def test_lts_input_errors_name_the_problem():
    with pytest.raises(ValueError, match="patch_size"):
        LTSConfig(dims=3, patch_size=[8, 8])
    with pytest.raises(ValueError, match="at least 2 validation cases"):
        LTSScaler(LTSConfig(dims=2, patch_size=[8, 8])).fit(FitData(cases=half_and_half_cases(1, (8, 8))))
    with pytest.raises(ValueError, match="image_channels=0"):
        LTSNet(3, 0, 2)(torch.zeros(1, 3, 4, 4), torch.zeros(1, 1, 4, 4))


def test_lts_fits_multilabel_regions_through_the_link():
    """Region masks and a sigmoid link: a global over-confidence (T = 2) is found and NLL drops."""
    g = torch.Generator().manual_seed(7)
    cases = []
    for i in range(4):
        z_star = smooth_logits(2, (6, 24, 24), g, std=2.0)
        y = torch.bernoulli(torch.sigmoid(z_star), generator=g)
        cases.append(CaseLogits(f"case{i}", (2.0 * z_star).numpy(), y.numpy()))
    cfg = LTSConfig(dims=2, patch_size=[24, 24], batch_size=4, lr=0.05, steps_per_epoch=10, max_epochs=10,
                    patience=3, slice_axis=0)
    scaler = LTSScaler(cfg)
    record = scaler.fit(FitData(cases=cases, link=torch.sigmoid, multilabel=True))
    assert record["nll_after"] < record["nll_before"]
    t = scaler.net.temperature_map(torch.as_tensor(cases[0].logits), slice_axis=0)
    assert t.median().item() == pytest.approx(2.0, rel=0.15)
    with pytest.raises(ValueError, match="link"):
        LTSScaler(cfg).fit(FitData(cases=cases, multilabel=True))

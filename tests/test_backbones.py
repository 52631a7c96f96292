"""Every model preset trains and evaluates, in 2D and in 3D; deep-supervision outputs train through
the one loss path and inference takes the final output; a fixed input size (UNETR) is met by
inference and checked at start."""
from __future__ import annotations

import math

import nibabel as nib
import pytest
import torch

from mcseg.inference import volume as inference
from mcseg.inference.build import build_predictor, load_checkpoint
from mcseg.losses.deep_supervision import deep_supervision_loss
from mcseg.config import InferenceConfig
from mcseg.models import MbLSUNet2D, final_output, size_divisor, supervision_outputs
from mcseg.train import train

from .test_configs import options

# Per preset: tiny widths (a run takes seconds on one CPU thread) and the patch size per axis, the
# smallest multiple of the network's size divisor whose bottleneck still trains (more than one voxel).
BACKBONES = {
    "unet": (["model.channels=[4,8,16]", "model.strides=[2,2]", "model.num_res_units=1"], 16),
    "dynunet": (["model.kernel_size=[3,3,3]", "model.strides=[1,2,2]", "model.upsample_kernel_size=[2,2]",
                 "model.filters=[4,8,16]"], 16),
    "mbls_unet": (["model.channels=[4,8,16,32,64]"], 32),  # the default depth: divisor 32 (pools 2, 2, 2, 4)
    "upconv_unet": (["model.channels=[4,8,16]"], 16),
    "attention_unet": (["model.channels=[4,8,16]", "model.strides=[2,2]"], 16),
    "unetpp": (["model.features=[4,4,8,8,16,4]"], 32),
    "segresnet": (["model.init_filters=8", "model.blocks_down=[1,1,1]", "model.blocks_up=[1,1]"], 16),
    "unetr": (["model.feature_size=4", "model.hidden_size=32", "model.mlp_dim=32", "model.num_heads=2"], 32),
    "swin_unetr": (["model.feature_size=12", "model.depths=[1,1,1,1]", "model.num_heads=[3,3,3,3]",
                    "model.window_size=4", "model.norm_name=batch"], 32),  # batch: a 1-voxel bottleneck trains
}
TWO_D_ONLY = {"mbls_unet", "upconv_unet"}
SHAPE = (36, 40, 20)  # no axis a multiple of 16: 2D slices are padded (or windowed), 3D volumes windowed


def tiny_run(make_cfg, option: str, dims: int, extra=(), patch: int | None = None):
    """A two-step, one-epoch run of ``model=option`` on 3D phantoms (2D: slices), evaluated on one case."""
    widths, smallest = BACKBONES[option]
    size = ",".join([str(patch or smallest)] * dims)
    return make_cfg([
        "dataset=synthetic3d", "debug=fast", f"model={option}", f"dataset.sampling.dims={dims}",
        f"dataset.sampling.patch_size=[{size}]", "dataset.n_cases=4", f"dataset.shape=[{','.join(map(str, SHAPE))}]",
        "trainer.max_epochs=1", "trainer.val_max_cases=1", "posthoc.fit=[]", "posthoc.apply=[]",
        "evaluation.bootstrap_samples=0", "logger=none", "inference.overlap=0.25",
        f"dataset.sampling.flip_axes=[{','.join(map(str, range(dims)))}]", *widths, *extra,
    ])


def test_every_model_preset_has_tiny_widths_here():
    assert sorted(BACKBONES) == options("model"), "add the new preset's tiny widths to BACKBONES"


@pytest.mark.slow
@pytest.mark.parametrize(
    "option,dims", [(o, d) for o in sorted(BACKBONES) for d in (2, 3) if not (o in TWO_D_ONLY and d == 3)],
    ids=lambda v: str(v) if isinstance(v, str) else f"{v}d",
)
def test_every_model_preset_trains_and_evaluates(make_cfg, tmp_path, one_thread, option, dims):
    result = train(tiny_run(make_cfg, option, dims))
    history = load_checkpoint(tmp_path / "run/checkpoints/last.pt")["history"]
    assert math.isfinite(history[-1]["train/loss"])
    for key in ("test/mean_foreground_dice", "test/mean_ece"):
        assert result[key] is not None and math.isfinite(result[key]), key
    predictions = list((tmp_path / "run/eval/test/predictions").glob("*.nii.gz"))
    assert len(predictions) == 1 and nib.load(predictions[0]).shape == SHAPE  # the case's own geometry


@pytest.mark.parametrize("option,heads", [("unetpp", 4), ("dynunet", 2)])
def test_deep_supervision_trains_every_head_and_evaluates_the_final_output(make_cfg, one_thread, monkeypatch,
                                                                           option, heads):
    from mcseg.training import trainer

    seen = []

    def spy(loss_fn, outputs, label):
        seen.append([tuple(o.shape) for o in outputs])
        return deep_supervision_loss(loss_fn, outputs, label)

    monkeypatch.setattr(trainer, "deep_supervision_loss", spy)
    result = train(tiny_run(make_cfg, option, 2, ["model.deep_supervision=true"]))
    assert len(seen) == 2 and all(len(step) == heads for step in seen)
    patch = BACKBONES[option][1]
    assert all(shape == (2, 4, patch, patch) for shape in seen[0])  # every head at full resolution: the label as it is
    assert math.isfinite(result["test/mean_foreground_dice"])


def test_the_final_output_is_the_full_networks_and_comes_first_in_training():
    """UNet++ lists its nested outputs shallowest first, DynUNet stacks its heads after the final
    output: either way inference takes, and the loss weighs most, the output of the whole network."""
    from monai.networks.nets import BasicUNetPlusPlus, DynUNet

    torch.manual_seed(0)
    x = torch.randn(2, 1, 32, 32)
    unetpp = BasicUNetPlusPlus(2, 1, 3, features=(4, 4, 8, 8, 16, 4), deep_supervision=False).eval()
    with torch.no_grad():
        (plain,) = unetpp(x)
        unetpp.deep_supervision = True
        nested = unetpp(x)
    assert len(nested) == 4
    torch.testing.assert_close(final_output(nested), plain)
    torch.testing.assert_close(supervision_outputs(nested, 2)[0], plain)

    dynunet = DynUNet(2, 1, 3, kernel_size=[3, 3, 3], strides=[1, 2, 2], upsample_kernel_size=[2, 2],
                      filters=[4, 8, 16], deep_supervision=True, deep_supr_num=1)
    with torch.no_grad():
        stacked = dynunet.train()(x)  # instance norm without running statistics: train and eval agree
        final = dynunet.eval()(x)
    assert stacked.shape == (2, 2, 3, 32, 32)
    outputs = supervision_outputs(stacked, 2)
    assert len(outputs) == 2
    torch.testing.assert_close(outputs[0], final)
    assert supervision_outputs(final, 2) == [final] and final_output(final) is final


def test_deep_supervision_weights_halve_per_head_and_labels_shrink_to_a_smaller_head():
    labels_seen = []

    def mean_logit(logits, label):
        labels_seen.append(label)
        assert label.shape == (logits.shape[0], *logits.shape[2:])
        return logits.mean()

    label = torch.randint(0, 3, (2, 16, 16))
    outputs = [torch.full((2, 3, 16, 16), 1.0), torch.full((2, 3, 16, 16), 2.0), torch.full((2, 3, 8, 8), 4.0)]
    value = deep_supervision_loss(mean_logit, outputs, label)
    assert value.item() == pytest.approx((1.0 * 1 + 2.0 * 0.5 + 4.0 * 0.25) / 1.75)
    assert labels_seen[0] is label and torch.equal(labels_seen[2], label[:, ::2, ::2])  # nearest neighbour
    assert deep_supervision_loss(mean_logit, outputs[:1], label).item() == 1.0


@pytest.mark.parametrize("shape", [(1, 20, 28, 6), (1, 40, 36, 6), (1, 40, 36)], ids=["smaller", "larger", "2d-image"])
def test_a_fixed_size_network_sees_windows_of_exactly_its_size_also_on_2d_slices(shape):
    sizes = []

    class FixedSize(torch.nn.Module):
        def forward(self, x):
            sizes.append(tuple(x.shape[2:]))
            assert tuple(x.shape[2:]) == (32, 32)
            return torch.cat([x, -x], 1)

    cfg = inference.InferenceConfig(sw_batch_size=4, overlap=0.25)
    image = torch.randn(shape)
    out = inference.predict_logits(FixedSize(), image, 2, 16, cfg, input_size=(32, 32))
    assert sizes and out.shape == (2, *shape[1:])
    torch.testing.assert_close(out[0], image[0], rtol=1e-5, atol=1e-5)  # blended windows of an identity


def test_2d_slices_are_padded_at_least_to_the_training_patch():
    """A slice smaller than the patch, padded only to the size divisor, would leave a network of
    divisor 16 a one-voxel bottleneck that instance norm cannot normalise (UNet++, SwinUNETR)."""
    sizes = []

    class Spy(torch.nn.Module):
        def forward(self, x):
            sizes.append(tuple(x.shape[2:]))
            return x

    image = torch.randn(1, 12, 40, 3)
    out = inference.predict_logits(Spy(), image, 2, 16, inference.InferenceConfig(), roi_size=[32, 32])
    assert sizes == [(32, 48)] and out.shape == image.shape
    torch.testing.assert_close(out, image)


@pytest.mark.parametrize("option,dims,extra,patch,message", [
    ("unetr", 2, ["model.img_size=[64,64]"], None,
     r"dataset\.sampling\.patch_size=\[32, 32\] must equal model\.img_size"),
    ("unetr", 3, ["inference.roi_size=[64,64,64]"], None, r"inference\.roi_size=\[64, 64, 64\]: UNETR takes windows"),
    ("swin_unetr", 2, [], 48, r"dataset\.sampling\.patch_size=\[48, 48\]: .*multiple of 32"),
    ("mbls_unet", 3, [], None, r"MbLSUNet2D is a 2D network: set dataset\.sampling\.dims=2"),
], ids=["unetr-img_size", "unetr-roi_size", "swin_unetr-divisor", "mbls_unet-3d"])
def test_a_patch_the_network_cannot_take_is_refused_at_start_naming_the_key(make_cfg, option, dims, extra, patch,
                                                                             message):
    with pytest.raises(ValueError, match=message):
        train(tiny_run(make_cfg, option, dims, extra, patch))


def test_unetpp_without_deep_supervision_trains_under_ddp(tmp_path):
    """UNet++ computes its nested outputs' heads also when it returns only the last: under torchrun,
    DistributedDataParallel must look for the parameters without gradients, or the second step fails."""
    import torch.distributed as dist
    from monai.networks.nets import BasicUNetPlusPlus

    from mcseg.training.distributed import DistContext, wrap_model

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = wrap_model(BasicUNetPlusPlus(2, 1, 2, features=(4, 4, 8, 8, 16, 4)), DistContext(world_size=2),
                           torch.device("cpu"))
        for _ in range(2):
            final_output(model(torch.randn(2, 1, 32, 32))).sum().backward()
    finally:
        dist.destroy_process_group()


def _conv(cin: int, cout: int, k: int = 3) -> int:
    return k * k * cin * cout + cout  # weights and bias


def test_mbls_unet_is_the_margin_loss_authors_unet_at_their_defaults():
    """calibrate/net/unet.py UNet of github.com/Bala93/MarginLoss (filters 32 x (1, 2, 4, 8, 16),
    bottom_s=4), 1 channel, 3 classes: the issue measured 7.85 M parameters on their code;
    scripts/check_mbls_unet.py compares weights and outputs with it where a checkout is at hand."""
    model = MbLSUNet2D(1, 3).eval()
    widths = [32, 64, 128, 256, 512]
    encoder = sum(_conv(cin, c) + _conv(c, c) for cin, c in zip([1, *widths[:-1]], widths))
    decoder = sum(_conv(widths[i] + widths[i + 1], widths[i]) + _conv(widths[i], widths[i]) for i in range(4))
    head = _conv(32, 3, k=1)
    assert (encoder, decoder, head) == (4_711_648, 3_134_400, 99)
    assert sum(p.numel() for p in model.parameters()) == encoder + decoder + head == 7_846_147
    # no normalisation, no convolution in the upsampling: two convolutions per level and the head
    kinds = {type(m).__name__ for m in model.modules()}
    assert not any("Norm" in k for k in kinds)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) == 2 * 5 + 2 * 4 + 1
    levels = []
    for block in model.down:
        block.register_forward_hook(lambda _m, _i, out: levels.append(tuple(out.shape)))
    with torch.no_grad():
        out = model(torch.randn(8, 1, 64, 64))
    assert out.shape == (8, 3, 64, 64)
    assert levels == [(8, 32, 64, 64), (8, 64, 32, 32), (8, 128, 16, 16), (8, 256, 8, 8), (8, 512, 2, 2)]  # by 4 last
    assert size_divisor(model) == 32
    with torch.no_grad():
        assert model(torch.randn(1, 1, 96, 160)).shape == (1, 3, 96, 160)
    assert size_divisor(MbLSUNet2D(1, 3, channels=[4, 8, 16])) == 8 and size_divisor(
        MbLSUNet2D(1, 3, channels=[4, 8, 16], bottom_pool=2)) == 4


@pytest.mark.parametrize("bad,message", [
    ({"channels": [8]}, r"model\.channels=\[8\]"),
    ({"up_channels": [8, 8, 32, 32, 256]}, r"model\.up_channels=\[8, 8, 32, 32, 256\]"),
    ({"bottom_pool": 0}, r"model\.bottom_pool=0"),
])
def test_mbls_unet_refuses_bad_arguments_naming_them(bad, message):
    with pytest.raises(ValueError, match=message):
        MbLSUNet2D(1, 3, **bad)


@pytest.mark.parametrize("patch,ok", [(32, True), (64, True), (96, True), (16, False), (48, False), (80, False)])
def test_mbls_unet_takes_patches_that_are_multiples_of_32_only(make_cfg, patch, ok):
    from hydra.utils import instantiate

    cfg = make_cfg(["model=mbls_unet", "dataset.sampling.dims=2", f"dataset.sampling.patch_size=[{patch},{patch}]"])
    build = lambda: build_predictor(cfg, instantiate(cfg.model), instantiate(cfg.loss), torch.device("cpu"),  # noqa: E731
                                    InferenceConfig(), "fp32")
    if ok:
        assert build().divisor == 32
    else:
        with pytest.raises(ValueError, match=rf"dataset\.sampling\.patch_size=\[{patch}, {patch}\]: each size must "
                                             r"be a multiple of 32 \(the network downsamples by 32\)"):
            build()

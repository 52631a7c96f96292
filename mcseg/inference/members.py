"""The members of one prediction: test-time augmentation views and MC-dropout samples of a network.

A predictor with members (``inference.tta``, ``inference.mc_samples``; an ensemble of checkpoints,
:class:`mcseg.inference.predict.EnsemblePredictor`) predicts each case once per member, as a whole-volume
pass of the one inference path, and pools the members' **probabilities** (ValUES, Jungo & Reyes; nnU-Net's
``inference.mirror_axes`` instead averages logits inside every window, and composes with these).

* TTA (ValUES' 3D protocol): every combination of flips of the network's spatial axes (2^n views: 4 in 2D,
  8 in 3D, the identity included), flipped back before pooling; with ``noise`` also each view of the image
  plus Gaussian noise on the normalised image, one draw per case reused for every flip, its standard
  deviation drawn from U(0, ``tta_noise_std``) per case (batchgenerators' ``noise_variance=(0, 0.1)``,
  used as a standard deviation): 2 x 2^n views.
* MC dropout: ``mc_samples`` passes with only the dropout modules in training mode (normalisation stays
  in evaluation mode), each sample with its own seed.

Every random draw is seeded by the case: ``seed`` (``inference.member_seed``) and a CRC-32 of the case id,
so an evaluation repeats bit for bit and does not depend on the order of the cases.
"""
from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

TTA_KINDS = ("flips", "noise")


def case_seed(seed: int, case_id: str, member: int = 0) -> int:
    """A seed of its own for each case (and MC sample), independent of the order of the cases."""
    return (zlib.crc32(case_id.encode()) * 1_000_003 + int(seed) * 7919 + member) % (2**63 - 1)


def flip_views(dims: int, flips: bool) -> list[tuple[int, ...]]:
    """The network axes flipped in each view: every subset of ``range(dims)`` (the empty one first)."""
    if not flips:
        return [()]
    return [c for n in range(dims + 1) for c in itertools.combinations(range(dims), n)]


def untrained_flips(dims: int, trained: Sequence[int], tta: Sequence[str], mirror_axes: Sequence[int]) -> list[int]:
    """The network axes that inference flips (``tta`` with ``flips``: every axis; ``mirror_axes``: nnU-Net's
    test-time mirroring) but training never flipped (``dataset.sampling.flip_axes``). A flipped view of such an
    axis is an input the network never saw: TTA and mirroring assume a network that is (nearly) equivariant to
    the flip, which nnU-Net obtains by training with mirroring. On anatomy of a fixed orientation a network
    trained without flips can fail outright on its flipped views (docs/results.md, "Uncertainty compared")."""
    flipped = set(range(dims)) if "flips" in tta else set()
    return sorted((flipped | {int(a) for a in mirror_axes}) - {int(a) for a in trained})


def dropout_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The dropout modules of ``model`` that drop something (p > 0)."""
    kinds = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout)
    return [m for m in model.modules() if isinstance(m, kinds) and float(getattr(m, "p", 0.0)) > 0]


@contextmanager
def mc_dropout(model: torch.nn.Module):
    """Only the dropout modules in training mode for the block (the rest, normalisation included, stays as
    it is), then back."""
    modules = dropout_modules(model)
    states = [m.training for m in modules]
    for m in modules:
        m.train()
    try:
        yield
    finally:
        for m, state in zip(modules, states):
            m.train(state)


@contextmanager
def seeded(seed: int, device: torch.device):
    """torch's global generator (and the device's) seeded for the block and restored after it, so that
    member sampling neither depends on nor disturbs the caller's random state (exact resumes)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def check_members(mc_samples: int, tta: list[str], noise_std: float, model: torch.nn.Module) -> None:
    """One line naming the key for member settings that cannot work."""
    if isinstance(mc_samples, bool) or int(mc_samples) != mc_samples or mc_samples < 0 or mc_samples == 1:
        raise ValueError(f"inference.mc_samples={mc_samples}: expected an integer >= 2 (MC-dropout passes), "
                         "or 0 for none")
    if int(mc_samples) > 0 and not dropout_modules(model):
        raise ValueError(f"inference.mc_samples={mc_samples}: {type(model).__name__} has no dropout module with p > 0; "
                         "train it with model.dropout=<p> (unet, attention_unet, unetpp; segresnet: "
                         "model.dropout_prob; unetr: model.dropout_rate) for MC dropout")
    unknown = [t for t in tta if t not in TTA_KINDS]
    if unknown:
        raise ValueError(f"inference.tta={list(tta)}: unknown {unknown}; expected a list of {', '.join(TTA_KINDS)}")
    if "noise" in tta and not float(noise_std) > 0:
        raise ValueError(f"inference.tta_noise_std={noise_std}: the noise view needs a standard deviation > 0")


def noisy_inputs(image: torch.Tensor, noise: bool, noise_std: float, seed: int) -> Iterator[torch.Tensor]:
    """The image, then (with ``noise``) the image plus one seeded Gaussian draw (standard deviation from
    U(0, ``noise_std``)); the noise is drawn on the CPU, so the same seed gives the same draw on any device."""
    yield image
    if noise:
        generator = torch.Generator().manual_seed(seed)
        std = float(torch.rand((), generator=generator)) * float(noise_std)
        draw = torch.randn(image.shape, generator=generator, dtype=torch.float32) * std
        yield image + draw.to(image.device, image.dtype)

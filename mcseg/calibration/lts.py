"""Local temperature scaling (LTS; Ding, Han, Liu & Niethammer, "Local Temperature Scaling for
Probability Calibration", ICCV 2021, official code uncbiag/LTS).

A small convolutional network maps a case's logits z (and optionally its image x) to one positive
temperature per voxel, ``p = link(z / T(z, x))``. All K logits of a voxel share its T, so the
softmax arg-max (and the sign of every sigmoid logit) is unchanged: Dice and HD95 are too.

Architecture, as the paper's tree-like network (one convolution layer deep): four "leaf" temperature
maps and three gates, each a kernel-5, dilation-2 convolution of the logits; the gates (sigmoids)
mix leaf 1 with 2, leaf 3 with 4, then the two results (a two-level binary tree); with the image, a
fifth leaf is a convolution of the image and a fourth gate (of the logits) mixes it with the tree's
output. Every weight starts at zero. Changes here: T = floor + softplus(a) instead of
ReLU(a + 1) + 1e-8 (no dead gradient, T >= floor), with the leaves' constant chosen so that T = 1
(the identity) at the start; small random gate weights (else the leaves never differ); the logits
divided by their standard deviation on the fitting cases; replicate instead of reflect padding
(any patch size); 2D (slice by slice) or 3D convolutions.

Training (as the paper): NLL of the calibrated probabilities, Adam, on the validation cases, keeping
the weights with the lowest NLL on held-out validation cases (early stopping); here the logit
convolutions' weights learn at ``lr / fan_in`` (:meth:`LTSNet.param_groups`). Samples are 2D slices
or 3D patches drawn by the training sampler (:class:`~mcseg.data.sampling.PatchDataset`, no
augmentation), so memory is one batch; the held-out NLL and :meth:`LTSNet.temperature_map` run in
chunks (slices, or slabs with a halo of the receptive radius), so a whole volume is never pushed
through at once and the chunked result equals the whole-volume one.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import math
import pickle
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from mcseg.calibration.lts_config import LTSConfig
from mcseg.data.cases import CaseData
from mcseg.files import atomic_write, torch_save
from mcseg.data.sampling import PatchDataset
from mcseg.runtime import share_cpu

log = logging.getLogger(__name__)

KERNEL, DILATION = 5, 2
HALO = (KERNEL // 2) * DILATION  # receptive radius of the network, in voxels
_LOG_FLOOR = 1e-12


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class LTSNet(nn.Module):
    """Per-voxel temperature network (see the module docstring).

    Args:
        num_classes: K, the logit channels.
        image_channels: channels of the image input; 0 = logits only.
        dims: 2 (applied slice by slice) or 3.
        floor: smallest temperature (> 0).
        gate_init_std: standard deviation of the gates' initial weights (see below).
    """

    def __init__(self, num_classes: int, image_channels: int = 0, dims: int = 3, floor: float = 0.05,
                 gate_init_std: float = 0.01) -> None:
        super().__init__()
        if dims not in (2, 3):
            raise ValueError(f"LTS: dims={dims}: expected 2 or 3")
        if num_classes < 1 or image_channels < 0:
            raise ValueError(f"LTS: num_classes={num_classes} and image_channels={image_channels} must be >= 1 and >= 0")
        if not 0 < floor < 1:
            raise ValueError(f"LTS: floor={floor}: expected a value in (0, 1)")
        self.num_classes, self.image_channels, self.dims, self.floor = num_classes, image_channels, dims, float(floor)
        conv = nn.Conv2d if dims == 2 else nn.Conv3d
        n_gates = 4 if image_channels else 3

        def layer(cin: int, cout: int) -> nn.Module:
            return conv(cin, cout, KERNEL, padding=HALO, dilation=DILATION, padding_mode="replicate")

        # The convolutions see the logits divided by their standard deviation on the fitting cases
        # (set by fit_lts), so one learning rate suits logits of any scale.
        self.register_buffer("input_scale", torch.ones(()))
        self.leaves = layer(num_classes, 4)  # four leaf temperature maps from the logits
        self.gates = layer(num_classes, n_gates)
        self.image_leaf = layer(image_channels, 1) if image_channels else None
        # T = floor + softplus(leaf + offset): with zero weights every leaf is the offset, so T = 1.
        self.offset = _inverse_softplus(1.0 - self.floor)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Conv3d)):
                nn.init.zeros_(module.weight)
                nn.init.zeros_(module.bias)
        # With every weight zero (the official initialisation) the four leaves get equal gradients and
        # stay equal, so the tree never branches. Small random gate weights break that symmetry and
        # still give T = 1 at the start (equal leaves mixed in any proportion are the same leaf).
        nn.init.normal_(self.gates.weight, std=gate_init_std)

    def param_groups(self, lr: float) -> list[dict]:
        """Adam groups: the logit convolutions' weights at ``lr / fan_in``, everything else at ``lr``.

        Adam moves every weight by about ``lr`` a step, so a convolution over K x 5^d logit taps
        would move T's pre-activation K x 5^d times faster than a bias: it fits label noise through
        the neighbouring logits long before the temperature level is right (3D above all).
        """
        fast = [p for n, p in self.named_parameters() if n not in ("leaves.weight", "gates.weight")]
        fan_in = self.leaves.weight[0].numel()
        return [{"params": fast, "lr": lr}, {"params": [self.leaves.weight, self.gates.weight], "lr": lr / fan_in}]

    def config(self) -> dict:
        return {"num_classes": self.num_classes, "image_channels": self.image_channels, "dims": self.dims,
                "floor": self.floor}

    def forward(self, logits: Tensor, image: Tensor | None = None) -> Tensor:
        """Temperatures ``B x 1 x spatial`` of a batch of ``B x K x spatial`` logits (and ``B x C x spatial`` image)."""
        if (image is None) != (self.image_leaf is None):
            raise ValueError(f"LTS was built with image_channels={self.image_channels}; "
                             f"{'no image' if image is None else 'an image'} was given")
        u = logits * self.input_scale
        leaf = self.leaves(u) + self.offset
        g = torch.sigmoid(self.gates(u))
        left = leaf[:, 0:1] * g[:, 0:1] + leaf[:, 1:2] * (1 - g[:, 0:1])
        right = leaf[:, 2:3] * g[:, 1:2] + leaf[:, 3:4] * (1 - g[:, 1:2])
        a = left * g[:, 2:3] + right * (1 - g[:, 2:3])
        if self.image_leaf is not None:
            a = a * g[:, 3:4] + (self.image_leaf(image) + self.offset) * (1 - g[:, 3:4])
        return self.floor + F.softplus(a)

    @torch.no_grad()
    def temperature_map(self, logits: Tensor, image: Tensor | None = None, slice_axis: int = -1,
                        chunk: int = 16) -> Tensor:
        """Temperatures ``*S`` of one case's channels-first logits ``K x *S`` (image ``C x *S``), in chunks.

        2D nets on a volume: slice by slice along spatial ``slice_axis``, ``chunk`` slices at a time;
        on a 2D case: the whole case. 3D nets: slabs of ``chunk`` planes along the last axis plus a halo
        of :data:`HALO` planes each side, so the result equals the whole-volume one.
        """
        if logits.ndim - 1 not in (2, 3) or logits.shape[0] != self.num_classes:
            raise ValueError(f"LTS: expected K x *S logits with K={self.num_classes}, got {tuple(logits.shape)}")
        if chunk < 1:
            raise ValueError(f"LTS: chunk={chunk}: expected >= 1")
        param = next(self.parameters())
        logits = logits.to(param.device, param.dtype)
        image = None if image is None else image.to(param.device, param.dtype)
        spatial = logits.ndim - 1
        if self.dims == 2:
            if spatial == 2:
                return self(logits[None], None if image is None else image[None])[0, 0]
            axis = slice_axis % 3 + 1
            z = logits.movedim(axis, 0)  # D x K x H x W: slices as the batch
            x = None if image is None else image.movedim(axis, 0)
            out = torch.cat([self(z[i:i + chunk], None if x is None else x[i:i + chunk])[:, 0]
                             for i in range(0, z.shape[0], chunk)])
            return out.movedim(0, axis - 1)
        if spatial != 3:
            raise ValueError(f"LTS: a 3D net needs K x D x H x W logits, got {tuple(logits.shape)}")
        n = logits.shape[-1]
        parts = []
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            a, b = max(lo - HALO, 0), min(hi + HALO, n)
            t = self(logits[None, ..., a:b], None if image is None else image[None, ..., a:b])[0, 0]
            parts.append(t[..., lo - a:hi - a])
        return torch.cat(parts, dim=-1)

    def apply(self, logits: Tensor, image: Tensor | None = None, slice_axis: int = -1, chunk: int = 16) -> Tensor:
        """Calibrated logits ``z / T`` of one case (``K x *S``, same dtype and device as ``logits``)."""
        t = self.temperature_map(logits, image, slice_axis, chunk)
        return logits / t.to(logits.device, logits.dtype)[None]


def lr_factor(schedule: str, step: int, total: int) -> float:
    """The factor of ``lr`` at (0-based) ``step`` of ``total``: 1 (``constant``), or the cosine decay of
    Loshchilov & Hutter (SGDR, ICLR 2017) without restarts, ``(1 + cos(pi step / total)) / 2`` (``cosine``)."""
    return 1.0 if schedule == "constant" else 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


#: the patch side LTS takes where ``patch_size`` is unset (3D; 2D slices: 256), cut to the largest fit case
PATCH = {3: 64, 2: 256}
#: voxel passes (patch voxels x steps) of a fit on a CPU with ``max_epochs`` unset: 205 CPU s on the 31 hippocampus
#: validation cases (1.3-1.8 us a voxel and step, one thread); 2^25 (an epoch of one pass over the voxels) ended 6% above the NLL of the
#: settings before #58 on 2 hippocampus cases (docs/posthoc.md, "LTS on a folder")
CPU_VOXEL_BUDGET = 1 << 27
_STEPS, _MAX_EPOCHS = 50, 200
#: ``(lr, lr_schedule)`` where the CPU budget sets the epochs: at 0.01 the fit still improved at the budget's end;
#: 0.1 gave a lower NLL on the 2 and the 31 hippocampus cases, constant lower than decayed by the cosine on the 31
#: (docs/posthoc.md, "LTS on a folder")
BUDGET_LR = (0.1, "constant")
#: ``(lr, lr_schedule)`` otherwise (GPU, or ``max_epochs`` set): the settings before #58, not re-measured
LR = (0.01, "constant")


def resolve_config(cfg: LTSConfig, shapes: Sequence[Sequence[int]], device: str | torch.device = "cpu"
                   ) -> tuple[LTSConfig, dict]:
    """``cfg`` with its unset (``None``) sizes and learning rate chosen from the spatial ``shapes`` of the training
    cases and the ``device`` (:class:`LTSConfig`), and what was chosen: ``{key: value}`` of the keys chosen here."""
    chosen: dict = {}
    patch = cfg.patch_size
    if patch is None:
        extents = np.max(np.asarray([tuple(s) for s in shapes]), axis=0).tolist()
        if cfg.dims == 2 and len(extents) == 3:
            extents.pop(cfg.slice_axis % 3)  # the slice's plane
        patch = chosen["patch_size"] = [int(min(PATCH[cfg.dims], e)) for e in extents[-cfg.dims:]]
    per_step = cfg.batch_size * int(np.prod(patch))
    steps = cfg.steps_per_epoch
    if steps is None:  # not fewer on small data: early stopping's patience counts epochs
        steps = chosen["steps_per_epoch"] = _STEPS
    epochs, budgeted = cfg.max_epochs, False
    if epochs is None:
        budgeted = torch.device(device).type == "cpu"
        budget = CPU_VOXEL_BUDGET // (steps * per_step) if budgeted else _MAX_EPOCHS
        epochs = chosen["max_epochs"] = int(min(_MAX_EPOCHS, max(1, budget)))
    lr, schedule = BUDGET_LR if budgeted else LR
    if cfg.lr is None:
        chosen["lr"] = lr
    if cfg.lr_schedule is None:
        chosen["lr_schedule"] = schedule
    sizes = {"patch_size": list(patch), "steps_per_epoch": steps, "max_epochs": epochs,
             "lr": cfg.lr if cfg.lr is not None else lr, "lr_schedule": cfg.lr_schedule or schedule}
    return LTSConfig(**{**asdict(cfg), **sizes}), chosen


@dataclass
class CaseLogits:
    """One validation case for fitting: ``logits`` K x *S, ``label`` *S (or R x *S), optional ``image`` C x *S."""

    case_id: str
    logits: np.ndarray | Tensor
    label: np.ndarray | Tensor
    image: np.ndarray | Tensor | None = None


def _as_numpy(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, Tensor) else np.asarray(a)


def _voxel_nll(z: Tensor, y: Tensor, link: Callable | None, multilabel: bool) -> Tensor:
    """NLL per voxel (``B x *S``; mean over regions for multi-label) of calibrated logits ``B x K x *S``,
    as :func:`mcseg.calibration.logit_scaling.nll` but unreduced; softmax (``link=None``) from ``log_softmax``."""
    if link is None:
        return F.cross_entropy(z, y.long(), reduction="none")
    p = link(z)
    if multilabel:
        t = y.to(p.dtype)
        return -(t * p.clamp_min(_LOG_FLOOR).log() + (1 - t) * (1 - p).clamp_min(_LOG_FLOOR).log()).mean(1)
    return -p.gather(1, y.long()[:, None]).clamp_min(_LOG_FLOOR).log()[:, 0]


class _Stacked:
    """Training view of the cases: ``image`` = [logits, image?, inside] so one crop cuts all three
    (``inside`` is 1 in the volume and 0 in the padding the sampler adds, which is excluded)."""

    def __init__(self, cases: Sequence[CaseLogits], use_image: bool) -> None:
        self.cases = []
        for c in cases:
            z = _as_numpy(c.logits).astype(np.float32, copy=False)
            parts = [z]
            if use_image:
                if c.image is None:
                    raise ValueError(f"LTS with use_image=true: case {c.case_id} has no image")
                parts.append(_as_numpy(c.image).astype(np.float32, copy=False))
            parts.append(np.ones((1, *z.shape[1:]), np.float32))
            self.cases.append(CaseData(c.case_id, np.concatenate(parts), _as_numpy(c.label), (1.0,) * (z.ndim - 1),
                                       np.eye(4)))


def _split(cases: Sequence[CaseLogits], holdout: float, seed: int) -> tuple[list, list]:
    if len(cases) < 2:
        raise ValueError(f"LTS needs at least 2 validation cases (one is held out for early stopping), got {len(cases)}")
    order = np.random.default_rng(seed).permutation(len(cases))
    n_held = min(max(1, round(holdout * len(cases))), len(cases) - 1)
    return [cases[i] for i in order[n_held:]], [cases[i] for i in order[:n_held]]


def heldout_nll(net: LTSNet | None, cases: Sequence[CaseLogits], link: Callable | None = None,
                multilabel: bool = False, slice_axis: int = -1, chunk: int = 16) -> float:
    """Mean NLL over every voxel of ``cases`` after LTS (``net=None``: before), computed case by case."""
    total, count = 0.0, 0
    for c in cases:
        z = torch.as_tensor(_as_numpy(c.logits), dtype=torch.float32)
        y = torch.as_tensor(_as_numpy(c.label))
        if net is not None:
            image = None if net.image_channels == 0 else torch.as_tensor(_as_numpy(c.image), dtype=torch.float32)
            z = net.apply(z, image, slice_axis, chunk)
        v = _voxel_nll(z[None], y[None], link, multilabel)
        total, count = total + float(v.sum()), count + v.numel()
    return total / count


def fit_lts(cases: Sequence[CaseLogits], cfg: LTSConfig, link: Callable | None = None,
            multilabel: bool = False) -> tuple[LTSNet, dict]:
    """Fit an :class:`LTSNet` on validation ``cases``; return it (best held-out weights) and a record.

    ``link`` maps calibrated logits to probabilities (``None``: softmax, NLL computed from
    ``log_softmax``); ``multilabel`` says the labels are ``R x *S`` region masks. The record holds
    ``nll_before`` / ``nll_after`` on the held-out cases (identity weights are kept if training never
    beat them), the epochs run, the best epoch and the case split.
    """
    if multilabel and link is None:
        raise ValueError("LTS on multi-label outputs needs the loss's link (sigmoid-type), got none")
    train_cases, held_cases = _split(list(cases), cfg.holdout, cfg.seed)
    cfg, chosen = resolve_config(cfg, [_as_numpy(c.logits).shape[1:] for c in train_cases], "cpu")
    k = int(_as_numpy(train_cases[0].logits).shape[0])
    image_channels = int(_as_numpy(train_cases[0].image).shape[0]) if cfg.use_image else 0
    torch.manual_seed(cfg.seed)
    net = LTSNet(k, image_channels, cfg.dims, cfg.floor)
    stacked = _Stacked(train_cases, cfg.use_image)
    std = float(np.sqrt(np.mean([np.mean(np.square(c.image[:k], dtype=np.float64)) for c in stacked.cases])))
    net.input_scale.fill_(1.0 / max(std, 1e-6))
    sampler = PatchDataset(stacked.cases, cfg.dims, cfg.patch_size, cfg.steps_per_epoch * cfg.batch_size,
                           cfg.foreground_ratio, slice_axis=cfg.slice_axis, seed=cfg.seed)
    optimizer = torch.optim.Adam(net.param_groups(cfg.lr))
    total = cfg.max_epochs * cfg.steps_per_epoch  # early stopping may end sooner; the schedule spans the budget
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: lr_factor(cfg.lr_schedule, t, total))
    best = before = heldout_nll(None, held_cases, link, multilabel)
    best_state, best_epoch, stale, epoch = copy.deepcopy(net.state_dict()), -1, 0, 0
    n = cfg.steps_per_epoch * cfg.batch_size
    bar = tqdm(total=cfg.max_epochs * cfg.steps_per_epoch, desc="LTS", unit="step", disable=None, leave=False,
               dynamic_ncols=True, file=sys.stderr)  # the time left assumes every epoch runs (early stopping: less)
    for epoch in range(cfg.max_epochs):
        net.train()
        for step in range(cfg.steps_per_epoch):
            share_cpu("cpu")  # a busy machine: fewer torch threads (mcseg.runtime.AdaptiveThreads)
            batch = [sampler[epoch * n + step * cfg.batch_size + j] for j in range(cfg.batch_size)]
            x = torch.stack([b["image"] for b in batch])
            y = torch.stack([b["label"] for b in batch]).long()  # samples keep the compact label type
            z, inside = x[:, :k], x[:, -1] > 0.5
            image = x[:, k:k + image_channels] if image_channels else None
            v = _voxel_nll(z / net(z, image), y, link, multilabel)
            loss = (v * inside).sum() / inside.sum().clamp_min(1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.update()
        net.eval()
        score = heldout_nll(net, held_cases, link, multilabel, cfg.slice_axis, cfg.chunk)
        log.debug("LTS epoch %d: last batch NLL %.5f, held-out NLL %.5f", epoch, float(loss.detach()), score)
        if score < best:
            best, best_state, best_epoch, stale = score, copy.deepcopy(net.state_dict()), epoch, 0
        else:
            stale += 1
            if stale >= cfg.patience:
                break
    bar.close()
    net.load_state_dict(best_state)
    net.eval()
    record = {"nll_before": before, "nll_after": best, "epochs": epoch + 1, "best_epoch": best_epoch,
              "train_cases": [c.case_id for c in train_cases], "heldout_cases": [c.case_id for c in held_cases],
              "config": asdict(cfg), "chosen": chosen,
              "net": net.config()}
    log.info("LTS: held-out NLL %.5f -> %.5f (best epoch %d of %d)", before, best, best_epoch, epoch + 1)
    return net, record


def save_lts(net: LTSNet, path: Path) -> str:
    """Write the weights and the net's settings to ``path`` (plain tensors and numbers); return its sha256."""
    path = Path(path)
    atomic_write(path, lambda tmp: torch_save({"config": net.config(), "state_dict": net.state_dict()}, tmp))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_lts(path: Path, sha256: str | None = None, map_location: str | torch.device = "cpu") -> LTSNet:
    """Read :func:`save_lts`'s file with ``weights_only=True``; ``sha256`` (if given) must match."""
    path = Path(path)
    if not path.is_file():
        raise OSError(f"{path}: LTS weights not found; refit post-hoc calibration (posthoc.refit=true)")
    if sha256 is not None and hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        raise ValueError(f"{path}: LTS weights do not match the sha256 recorded in calibration.json; "
                         f"refit post-hoc calibration (posthoc.refit=true)")
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
        net = LTSNet(**blob["config"])
        net.load_state_dict(blob["state_dict"])
    except (RuntimeError, KeyError, TypeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise ValueError(f"{path}: not an LTS weights file ({exc}); refit post-hoc calibration "
                         f"(posthoc.refit=true)") from None
    return net.eval()

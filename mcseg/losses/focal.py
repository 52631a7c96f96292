"""Focal-loss family: focal, FLSD-53 (sample-dependent gamma), dual focal, focal calibration loss (FCL), AdaFocal."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from .base import SegmentationLoss, check_bool, check_choice, check_float, check_int, no_autocast, one_hot
from .brier import brier_per_voxel

__all__ = ["AdaFocalLoss", "DualFocalLoss", "FCLLoss", "FLSDLoss", "FocalLoss", "focal_per_voxel"]


def focal_per_voxel(base: Tensor, log_p_y: Tensor, gamma: float | Tensor) -> Tensor:
    """``-base^gamma * log p_y``; ``base`` is clamped to the smallest positive float so that
    ``0 < gamma < 1`` keeps a finite gradient when ``base`` is exactly 0 (p_y == 1)."""
    base = base.clamp(min=torch.finfo(base.dtype).tiny)
    return -base.pow(gamma) * log_p_y


def _log_p_y(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    log_probs = torch.log_softmax(logits, dim=1)
    return log_probs, log_probs.gather(1, target.unsqueeze(1)).squeeze(1)


class FocalLoss(SegmentationLoss):
    """Softmax focal loss (Lin et al., ICCV 2017; calibration: Mukhoti et al., NeurIPS 2020).

    ``-(1 - p_y)^gamma log p_y`` per voxel, MEAN over non-ignored voxels (several public
    versions sum instead). ``gamma = 0`` is CE. Soft targets q (the rater mean):
    ``-sum_k q_k (1 - p_k)^gamma log p_k``, the mean of the raters' focal losses.

    Args:
        gamma: focusing parameter >= 0; default 3 (the segmentation study; 1 and 2 also swept).
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(self, gamma: float = 3.0, ignore_index: int | None = None, reduction: str = "mean") -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma = check_float("gamma", gamma, low=0.0)

    soft_targets = True

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        _, log_p_y = _log_p_y(logits, target)
        return self.reduce(focal_per_voxel(-torch.expm1(log_p_y), log_p_y, self.gamma), valid)

    def compute_soft(self, logits: Tensor, q: Tensor) -> Tensor:
        log_probs = torch.log_softmax(logits, dim=1)
        return self.reduce((q * focal_per_voxel(-torch.expm1(log_probs), log_probs, self.gamma)).sum(dim=1), None)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, {super().extra_repr()}"


class FLSDLoss(SegmentationLoss):
    """FLSD-53: focal loss with a sample-dependent gamma (Mukhoti et al., NeurIPS 2020).

    ``gamma = gamma_low if p_y < threshold else gamma_high`` (5 below 0.2, else 3), chosen
    per voxel with ``torch.where`` (gamma is piecewise constant: no gradient through it).
    Mean over non-ignored voxels.

    Args:
        gamma_low: gamma for hard voxels (p_y < threshold); default 5.
        gamma_high: gamma for the others; default 3.
        threshold: p_y threshold in (0, 1]; default 0.2.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(
        self,
        gamma_low: float = 5.0,
        gamma_high: float = 3.0,
        threshold: float = 0.2,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma_low = check_float("gamma_low", gamma_low, low=0.0)
        self.gamma_high = check_float("gamma_high", gamma_high, low=0.0)
        self.threshold = check_float("threshold", threshold, low=0.0, high=1.0, low_open=True)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        _, log_p_y = _log_p_y(logits, target)
        hard = log_p_y.detach().exp() < self.threshold
        gamma = torch.where(hard, self.gamma_low, self.gamma_high).to(log_p_y.dtype)
        return self.reduce(focal_per_voxel(-torch.expm1(log_p_y), log_p_y, gamma), valid)

    def extra_repr(self) -> str:
        return (
            f"gamma_low={self.gamma_low}, gamma_high={self.gamma_high}, threshold={self.threshold}, "
            f"{super().extra_repr()}"
        )


class DualFocalLoss(SegmentationLoss):
    """Dual focal loss (Tao et al., ICML 2023).

    ``-(1 - p_y + p_j)^gamma log p_y`` per voxel, ``p_j`` the largest probability strictly
    below ``p_y`` (0 if none), as in the official code (gradient flows through p_j). MEAN
    over non-ignored voxels (the official code sums by default).

    Args:
        gamma: >= 0; default 5 (the paper's CIFAR / ResNet-50 setting; tuned per dataset).
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(self, gamma: float = 5.0, ignore_index: int | None = None, reduction: str = "mean") -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma = check_float("gamma", gamma, low=0.0)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs, log_p_y = _log_p_y(logits, target)
        probs = log_probs.exp()
        p_y = log_p_y.exp()
        below = probs < p_y.unsqueeze(1)
        p_j = torch.where(below, probs, torch.zeros_like(probs)).amax(dim=1)
        return self.reduce(focal_per_voxel(1.0 - p_y + p_j, log_p_y, self.gamma), valid)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, {super().extra_repr()}"


class FCLLoss(SegmentationLoss):
    """Focal calibration loss, FCL (Liang et al., arXiv 2410.18321, 2024):
    ``focal(gamma) + alpha * ||p - e_y||_2^2`` per voxel.

    The second term is the (squared) Brier score, summed over classes (not divided by K).
    With ``self_adaptive=True`` it is multiplied by the DETACHED ``(1 - p_y)^2``.
    Mean over non-ignored voxels. ``alpha = 0`` is the focal loss.

    Args:
        gamma: focal parameter >= 0; default 2.
        alpha: weight (lambda) of the Brier term >= 0; default 1.
        self_adaptive: weight the Brier term by ``(1 - p_y)^2`` (detached); default False.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`.
    """

    def __init__(
        self,
        gamma: float = 2.0,
        alpha: float = 1.0,
        self_adaptive: bool = False,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.gamma = check_float("gamma", gamma, low=0.0)
        self.alpha = check_float("alpha", alpha, low=0.0)
        self.self_adaptive = check_bool("self_adaptive", self_adaptive)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        log_probs, log_p_y = _log_p_y(logits, target)
        one_minus_p_y = -torch.expm1(log_p_y)
        brier = brier_per_voxel(log_probs.exp(), one_hot(target, logits.shape[1], logits.dtype))
        if self.self_adaptive:
            brier = brier * one_minus_p_y.detach().square()
        return self.reduce(focal_per_voxel(one_minus_p_y, log_p_y, self.gamma) + self.alpha * brier, valid)

    def extra_repr(self) -> str:
        return (
            f"gamma={self.gamma}, alpha={self.alpha}, self_adaptive={self.self_adaptive}, "
            f"{super().extra_repr()}"
        )


class AdaFocalLoss(SegmentationLoss):
    """AdaFocal: focal loss with one gamma per equal-mass confidence bin, adapted every epoch
    from the validation split (Ghosh, Schaaf & Gormley, "AdaFocal: Calibration-aware Adaptive
    Focal Loss", NeurIPS 2022; official code 3mcloud/adafocal, ``losses/adafocal.py``).

    **Loss.** Per voxel, ``p_t = softmax(z)_y`` (the TRUE-class probability, not the
    confidence) picks the bin ``b`` whose ``[lower_b, upper_b)`` holds it (the first bin open
    below, the last open above; with repeated edges the last of the equal bins, as the official
    loop over bins) and its ``gamma_b``:

    * ``gamma_b >= 0``: ``-(1 - p_t + 1e-20)^gamma_b log p_t`` (focal);
    * ``gamma_b < 0``: ``-(1 + p_t + 1e-20)^|gamma_b| log p_t`` (inverse focal).

    gamma is a constant for the gradient (the gradient flows through ``p_t`` in both factors).
    Reduced as every mcseg loss (default MEAN over non-ignored voxels); the official loss
    SUMS (``reduction="sum"`` reproduces it).

    **Update** (trainer hooks, as :class:`~mcseg.losses.CALSLoss`): ``on_validation_start()``,
    ``on_validation_batch(logits, target)`` for every running-validation volume and
    ``on_validation_end(epoch)``, i.e. after each validation (``trainer.val_every``; the
    official ``update_gamma_every=-1`` is once per epoch, after its last training batch). On
    the validation voxels (top-1 confidence ``conf = max_k softmax(z)_k``, float32, and
    correctness ``1[argmax = y]``):

    1. equal-mass edges ``e = interp(linspace(0, n, K + 1), arange(n), sort(conf))`` in float64
       (numpy's ``interp``, clamped at the last value, as the official ``histedges_equalN``);
    2. per bin, with ``conf`` in ``(e_b, e_{b+1}]`` (right-closed, unlike the loss's
       ``[lo, hi)`` lookup, so the lowest confidence is in no bin: both as the official code),
       the signed gap ``g_b = mean conf - mean correct`` (0 for an empty bin; sums in float64).
       ``compare_dtype="float32"`` (default) compares as the authors' code does: float32
       confidences with the edges rounded to float32 (``conf.gt(edge.item())`` casts the
       edge to the tensor's dtype), so a confidence within one float32 step of an edge, e.g.
       a saturated 1.0, can change bins; ``"float64"`` compares exactly (the edges as
       computed). Measured (#34): over 12 updates in 6 runs, gamma differed between the two by
       up to 2.3e-3 relative (0.036 absolute); with float32 edges the gaps agree with the
       authors' to 1.5e-7 (they average in float32);
    3. ``gamma_b <- gamma_b exp(lambd g_b)`` if ``gamma_b > 0`` else ``gamma_b exp(-lambd g_b)``;
       then if ``|gamma_b| < switch``: ``gamma_b <- -switch`` if ``gamma_b > 0`` else
       ``+switch`` (the switch between focal and inverse focal); then clip to
       ``[gamma_min, gamma_max]``;
    4. the loss's bins become the edges of step 1.

    **Segmentation** (not in the official code, which bins every validation sample): the
    validation "set" is a uniform random subsample of ``sample_voxels`` non-ignored voxels,
    drawn over the whole validation pass (each voxel gets a uniform key from a CPU generator
    seeded with ``seed + updates``; the ``sample_voxels`` smallest keys are kept); edges AND
    gaps are computed on it. With fewer validation voxels than ``sample_voxels``, every voxel
    is used and, with ``compare_dtype="float32"``, the update is the official one up to the
    float32 means of step 2.

    **State** (buffers in ``state_dict``, so in checkpoints; resumes exactly): ``gamma``
    (``K``), ``edges`` (``K + 1``; initially uniform ``b / K``), ``updates`` (the number of
    updates done). Initially every ``gamma_b = gamma_init``.

    Args:
        num_bins: K >= 1; default 15.
        lambd: the update's lambda >= 0; default 1.
        gamma_init: initial gamma of every bin, in ``[gamma_min, gamma_max]``; default 1.
        gamma_max: default 20.
        gamma_min: default -2.
        switch: the switch point s >= 0; default 0.2.
        sample_voxels: size of the voxel subsample of the validation pass (>= K + 1);
            default 100000.
        seed: seed of the subsample (>= 0); default 0.
        compare_dtype: ``"float32"`` (default, the authors' comparison of confidences with the
            edges rounded to float32) or ``"float64"`` (exact), in the update's step 2 only:
            the loss's bin lookup compares in float64 either way, as the authors' loop over
            Python floats.
        ignore_index, reduction: see :class:`~mcseg.losses.base.SegmentationLoss`; ignored
            voxels are left out of the loss and of the validation statistics.
    """

    def __init__(
        self,
        num_bins: int = 15,
        lambd: float = 1.0,
        gamma_init: float = 1.0,
        gamma_max: float = 20.0,
        gamma_min: float = -2.0,
        switch: float = 0.2,
        sample_voxels: int = 100_000,
        seed: int = 0,
        compare_dtype: str = "float32",
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.num_bins = check_int("num_bins", num_bins, low=1)
        self.lambd = check_float("lambd", lambd, low=0.0)
        self.gamma_min = check_float("gamma_min", gamma_min)
        self.gamma_max = check_float("gamma_max", gamma_max, low=self.gamma_min)
        self.gamma_init = check_float("gamma_init", gamma_init, low=self.gamma_min, high=self.gamma_max)
        self.switch = check_float("switch", switch, low=0.0)
        self.sample_voxels = check_int("sample_voxels", sample_voxels, low=self.num_bins + 1)
        self.seed = check_int("seed", seed, low=0)
        self.compare_dtype = check_choice("compare_dtype", compare_dtype, ("float32", "float64"))
        f64 = torch.float64
        self.register_buffer("gamma", torch.full((self.num_bins,), self.gamma_init, dtype=f64))
        self.register_buffer("edges", torch.linspace(0.0, 1.0, self.num_bins + 1, dtype=f64))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))
        self._reset_sample()

    # -- loss ---------------------------------------------------------------------------
    def bin_of(self, p_t: Tensor) -> Tensor:
        """Bin index of each true-class probability (``[lo, hi)``, end bins open)."""
        interior = self.edges[1:-1].to(p_t.device)
        return torch.bucketize(p_t.detach().to(torch.float64), interior, right=True)

    def compute(self, logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
        _, log_p_t = _log_p_y(logits, target)
        p_t = log_p_t.exp()
        gamma = self.gamma.to(p_t.device)[self.bin_of(p_t)].to(p_t.dtype)
        base = 1.0 - torch.sign(gamma) * p_t + 1e-20
        return self.reduce(-base.pow(gamma.abs()) * log_p_t, valid)

    # -- trainer hooks ------------------------------------------------------------------
    def _reset_sample(self) -> None:
        self._keys = torch.empty(0, dtype=torch.float32)
        self._conf = torch.empty(0, dtype=torch.float32)
        self._correct = torch.empty(0, dtype=torch.bool)
        self._generator = None

    def on_validation_start(self) -> None:
        self._reset_sample()
        self._generator = torch.Generator().manual_seed(self.seed + int(self.updates))

    @torch.no_grad()
    def on_validation_batch(self, logits: Tensor, target: Tensor) -> None:
        if self._generator is None:
            raise RuntimeError("AdaFocalLoss.on_validation_batch called before on_validation_start().")
        with no_autocast(logits.device.type):
            logits, target, valid = self.prepare(logits, target)
            log_conf, pred = torch.log_softmax(logits, dim=1).max(dim=1)
            conf, correct = log_conf.exp().float().reshape(-1).cpu(), (pred == target).reshape(-1).cpu()
            if valid is not None:
                keep = valid.reshape(-1).cpu()
                conf, correct = conf[keep], correct[keep]
            keys = torch.rand(conf.shape[0], generator=self._generator)
            keys, conf, correct = torch.cat([self._keys, keys]), torch.cat([self._conf, conf]), torch.cat(
                [self._correct, correct]
            )
            if keys.shape[0] > self.sample_voxels:
                kept = torch.topk(keys, self.sample_voxels, largest=False, sorted=False).indices
                keys, conf, correct = keys[kept], conf[kept], correct[kept]
            self._keys, self._conf, self._correct = keys, conf, correct

    @staticmethod
    def equal_mass_edges(conf: Tensor, num_bins: int) -> Tensor:
        """``numpy.interp(linspace(0, n, K + 1), arange(n), sort(conf))`` in float64."""
        x = torch.sort(conf.to(torch.float64)).values
        n = x.shape[0]
        t = torch.arange(num_bins + 1, dtype=torch.float64) * (n / num_bins)  # numpy's linspace
        t[-1] = float(n)
        lo = t.floor().long().clamp(max=n - 1)
        hi = (lo + 1).clamp(max=n - 1)
        frac = (t - lo.to(torch.float64)).clamp(max=1.0)
        edges = x[lo] + frac * (x[hi] - x[lo])
        return torch.where(t >= n - 1, x[-1], edges)

    @staticmethod
    def calibration_gaps(
        conf: Tensor, correct: Tensor, edges: Tensor, compare: torch.dtype = torch.float32
    ) -> Tensor:
        """Per bin ``(edges[b], edges[b+1]]``, conf and edges compared in ``compare``: mean conf - mean
        correct (0 if empty), float64."""
        c, e = conf.to(compare), edges.to(compare)
        in_bin = (c[None] > e[:-1, None]) & (c[None] <= e[1:, None])  # K x n
        conf, correct = conf.to(torch.float64), correct.to(torch.float64)
        count = in_bin.sum(dim=1).to(torch.float64)
        gap = (in_bin * (conf - correct)[None]).sum(dim=1) / count.clamp(min=1)
        return torch.where(count > 0, gap, torch.zeros_like(gap))

    def updated_gamma(self, gaps: Tensor) -> Tensor:
        """Steps 3 of the update (see the class docstring) on the current gamma."""
        gamma = self.gamma.detach().cpu()
        gamma = torch.where(gamma > 0, gamma * torch.exp(self.lambd * gaps), gamma * torch.exp(-self.lambd * gaps))
        s = torch.full_like(gamma, self.switch)
        switched = torch.where(gamma > 0, -s, s)
        gamma = torch.where(gamma.abs() < self.switch, switched, gamma)
        return gamma.clamp(self.gamma_min, self.gamma_max)

    @torch.no_grad()
    def on_validation_end(self, epoch: int) -> None:
        check_int("epoch", epoch, low=0)
        conf, correct = self._conf, self._correct
        self._reset_sample()
        if conf.shape[0] == 0:
            warnings.warn("AdaFocalLoss: no validation voxels were seen; gammas and bins left unchanged.", stacklevel=2)
            return
        edges = self.equal_mass_edges(conf, self.num_bins)
        compare = getattr(torch, self.compare_dtype)
        self.gamma.copy_(self.updated_gamma(self.calibration_gaps(conf, correct, edges, compare)))
        self.edges.copy_(edges)
        self.updates += 1

    def extra_repr(self) -> str:
        return (
            f"num_bins={self.num_bins}, lambd={self.lambd}, gamma_init={self.gamma_init}, "
            f"gamma=[{self.gamma_min}, {self.gamma_max}], switch={self.switch}, "
            f"sample_voxels={self.sample_voxels}, seed={self.seed}, compare_dtype={self.compare_dtype}, "
            f"{super().extra_repr()}"
        )

"""Temperature and vector scaling of logits, fitted by minimising the NLL with L-BFGS.

Guo et al., "On calibration of modern neural networks", ICML 2017: temperature scaling divides
every logit by one T > 0 (argmax unchanged, so Dice and HD95 are too); vector scaling maps
class k's logit to ``w_k z_k + b_k`` (it can change the argmax). Both are fitted on held-out
(validation) logits by minimising the negative log-likelihood, in float32, with T
parametrised as exp(log T) so it stays positive.

Softmax outputs: NLL = -mean log p_y. Multi-label outputs (one sigmoid-type link per region):
NLL = -mean over voxels and regions of y log p + (1 - y) log(1 - p). The probabilities come
from the loss's own link (``link``), so a loss with a non-softmax inverse link (SPA) is scaled
consistently with how it is evaluated.

Temperature scaling can also be fitted by minimising the ECE of the fitting voxels
(``fit_temperature_ece``: the protocol's equal-width top-label ECE, a deterministic bounded 1-D
search over log T), as some segmentation papers do.

These are the one implementation of temperature and vector scaling in mcseg: Fiducio's TS and VS
(:mod:`mcseg.calibration.fiducio_adapters`) fit the same objective on the same voxels and give the same
maps (tests/test_fiducio_scalers.py; measured in docs/posthoc.md), but they calibrate a softmax only, so
mcseg keeps its own for what Fiducio lacks: sigmoid (multi-label) and other inverse links (SPA), the ECE
objective, and the identity kept when a fit would raise the NLL.
"""
from __future__ import annotations

from collections.abc import Callable

import math

import torch

from mcseg.metrics.binning import bin_index, bin_sums
from mcseg.metrics.calibration import top_label

SCALERS = ("temperature", "vector")
# Bounds of the ECE objective's search for T (the range PLAUSIBLE_TEMPERATURE of posthoc warns outside)
ECE_SEARCH = (0.05, 20.0)
_LOG_FLOOR = 1e-12


def inverse_link(probs: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """Logits whose link is ``probs``: ``ln p`` for softmax (softmax(ln p) = p, p summing to 1), the
    logit ``ln p - ln(1 - p)`` for sigmoids; probabilities are kept at least 1e-12 (1e-7 from 0 and 1
    for sigmoids), so that no logit is infinite."""
    if multilabel:
        p = probs.clamp(1e-7, 1 - 1e-7)
        return torch.log(p) - torch.log1p(-p)
    return torch.log(probs.clamp_min(1e-12))


def scale_logits(logits: torch.Tensor, params: dict, channel_dim: int = 1) -> torch.Tensor:
    """Apply fitted ``params`` to ``logits`` (channels on ``channel_dim``).

    ``{"temperature": T}`` gives ``z / T``; ``{"weight": [w_k], "bias": [b_k]}`` gives ``w_k z_k + b_k``.
    """
    if "temperature" in params:
        return logits / float(params["temperature"])
    shape = [1] * logits.ndim
    shape[channel_dim] = -1
    weight = torch.as_tensor(params["weight"], dtype=logits.dtype, device=logits.device).view(shape)
    bias = torch.as_tensor(params["bias"], dtype=logits.dtype, device=logits.device).view(shape)
    return logits * weight + bias


def nll(probs: torch.Tensor, target: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """Mean negative log-likelihood of ``probs`` (N x K) for ``target`` (N labels, or N x K in {0,1})."""
    if multilabel:
        t = target.float()
        return -(t * probs.clamp_min(_LOG_FLOOR).log() + (1 - t) * (1 - probs).clamp_min(_LOG_FLOOR).log()).mean()
    return -probs.gather(1, target.long()[:, None]).clamp_min(_LOG_FLOOR).log().mean()


def fit_scaler(kind: str, logits: torch.Tensor, target: torch.Tensor, link: Callable[[torch.Tensor], torch.Tensor],
               multilabel: bool = False, max_iter: int = 100) -> dict:
    """Fit ``kind`` (temperature | vector) to ``logits`` (N x K) and ``target``; return its parameters.

    The returned dict also holds ``nll_before`` (identity scaling) and ``nll_after``. If the
    optimiser ends above the identity's NLL (it cannot do better on these voxels), the identity
    is returned: post-hoc scaling never worsens the NLL it was fitted on.
    """
    if kind not in SCALERS:
        raise ValueError(f"post-hoc scaler {kind!r}: expected one of {', '.join(SCALERS)}")
    if logits.ndim != 2 or logits.shape[0] == 0:
        raise ValueError(f"fit_scaler: expected N x K logits with N > 0, got shape {tuple(logits.shape)}")
    logits = logits.detach().float()
    k = logits.shape[1]
    if kind == "temperature":
        log_t = torch.zeros((), device=logits.device, requires_grad=True)
        variables = [log_t]

        def params_of() -> dict:
            return {"temperature": float(log_t.detach().exp())}

        def forward() -> torch.Tensor:
            return logits / log_t.exp()
    else:
        weight = torch.ones(k, device=logits.device, requires_grad=True)
        bias = torch.zeros(k, device=logits.device, requires_grad=True)
        variables = [weight, bias]

        def params_of() -> dict:
            return {"weight": weight.detach().cpu().tolist(), "bias": bias.detach().cpu().tolist()}

        def forward() -> torch.Tensor:
            return logits * weight + bias

    identity = params_of()
    with torch.no_grad():
        before = float(nll(link(logits), target, multilabel))
    optimizer = torch.optim.LBFGS(variables, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nll(link(forward()), target, multilabel)
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        after = float(nll(link(forward()), target, multilabel))
    fitted = params_of()
    if not (after <= before) or not all(torch.isfinite(v).all() for v in variables):
        fitted, after = identity, before
    return {**fitted, "nll_before": before, "nll_after": after}


def voxel_ece(probs: torch.Tensor, target: torch.Tensor, multilabel: bool, n_bins: int) -> float:
    """Top-label ECE (equal-width bins, as the evaluation protocol) of ``probs`` (N x K) for ``target``.

    Multi-label: the mean over regions of each region's binary ECE (confidence max(p, 1 - p)),
    as the evaluator reads a region as the two-class problem (1 - p_r, p_r).
    """
    if multilabel:
        return sum(voxel_ece(torch.stack([1 - probs[:, r], probs[:, r]], 1), target[:, r].long(), False, n_bins)
                   for r in range(probs.shape[1])) / probs.shape[1]
    conf, pred = top_label(probs.T)
    return float(bin_sums(bin_index(conf, n_bins), conf, pred.long() == target.long(), n_bins).ece())


def fit_temperature_ece(logits: torch.Tensor, target: torch.Tensor, link: Callable[[torch.Tensor], torch.Tensor],
                        multilabel: bool = False, n_bins: int = 15, grid: int = 41, refine: int = 25) -> dict:
    """The T in ``ECE_SEARCH`` minimising the ECE of ``link(logits / T)``: a grid over log T, then a
    golden-section search between the best grid point's neighbours (deterministic). ECE is piecewise
    smooth in T, so the grid finds the right basin and the search refines it. T = 1 is kept unless a
    T with a lower ECE is found: the fit never raises the ECE of the voxels it is fitted on.

    Returns ``temperature``, ``ece_before``/``ece_after`` and ``nll_before``/``nll_after``.
    """
    if logits.ndim != 2 or logits.shape[0] == 0:
        raise ValueError(f"fit_temperature_ece: expected N x K logits with N > 0, got shape {tuple(logits.shape)}")
    logits = logits.detach().float()

    @torch.no_grad()
    def ece_at(log_t: float) -> float:
        return voxel_ece(link(logits / math.exp(log_t)), target, multilabel, n_bins)

    lo, hi = math.log(ECE_SEARCH[0]), math.log(ECE_SEARCH[1])
    points = [lo + (hi - lo) * i / (grid - 1) for i in range(grid)]
    values = [ece_at(x) for x in points]
    i = min(range(grid), key=values.__getitem__)
    best_x, best = points[i], values[i]
    a, b = points[max(i - 1, 0)], points[min(i + 1, grid - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = ece_at(c), ece_at(d)
    for _ in range(refine):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = ece_at(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = ece_at(d)
        for x, f in ((c, fc), (d, fd)):
            if f < best:
                best_x, best = x, f
    before = ece_at(0.0)
    if not best < before:
        best_x, best = 0.0, before
    with torch.no_grad():
        nll_before = float(nll(link(logits), target, multilabel))
        nll_after = float(nll(link(logits / math.exp(best_x)), target, multilabel))
    return {"temperature": math.exp(best_x), "ece_before": before, "ece_after": best,
            "nll_before": nll_before, "nll_after": nll_after}

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
"""
from __future__ import annotations

from collections.abc import Callable

import torch

SCALERS = ("temperature", "vector")
_LOG_FLOOR = 1e-12


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

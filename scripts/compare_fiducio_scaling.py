"""mcseg's temperature and vector scaling against Fiducio's TS and VS on the same voxels (issue #45, item 2).

Synthetic, over-confident voxels of a 3-class task with per-voxel logit offsets (seeded); each fit on the same
``N x 3`` table by the same objective (mean cross-entropy): mcseg's ``fit_scaler`` (L-BFGS, 100 iterations), Fiducio's
TS/VS with ``optimizer="lbfgs"`` (the same settings) and with the library's default (Adam, 200 steps, lr 0.1).
Prints a Markdown table: the fitted T (or w, b), the NLL after, max |Δp| against mcseg's map, fit seconds.
``--near-ties``: how many of 20,000 voxels whose two largest logits (about 20) differ by 1-4e-6 (a few float32
units in the last place) a scaler that keeps the arg-max in exact arithmetic moves in float32.

    OMP_NUM_THREADS=1 python scripts/compare_fiducio_scaling.py --voxels 200000 2000000
    OMP_NUM_THREADS=1 python scripts/compare_fiducio_scaling.py --voxels --near-ties
"""
from __future__ import annotations

import argparse
import time

import fiducio
import torch

from mcseg.calibration.logit_scaling import fit_scaler, scale_logits


def voxels(n: int, seed: int = 0, k: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, k, (n,), generator=g)
    logits = torch.nn.functional.one_hot(target, k).float() * 2.0 + torch.randn(n, k, generator=g) * 1.5
    return logits * 3.0 + torch.randn(n, 1, generator=g) * 5.0, target


def timed(fit):
    start = time.perf_counter()
    result = fit()
    return result, time.perf_counter() - start


def rows(n: int) -> list[str]:
    logits, target = voxels(n)
    softmax = lambda z: torch.softmax(z, 1)  # noqa: E731
    out = []
    for kind, theirs in (("temperature", fiducio.TS), ("vector", fiducio.VS)):
        ours, seconds = timed(lambda: fit_scaler(kind, logits, target, softmax, max_iter=100))
        mine = softmax(scale_logits(logits, ours))
        params = (f"T={ours['temperature']:.6f}" if kind == "temperature" else
                  f"w={[round(w, 4) for w in ours['weight']]} b={[round(b, 4) for b in ours['bias']]}")
        out.append(f"| {n} | mcseg `{kind}` (L-BFGS) | {params} | {ours['nll_after']:.7f} | 0 | {seconds:.2f} |")
        for optimizer in ("lbfgs", "adam"):
            cal, seconds = timed(lambda: theirs(optimizer=optimizer, device="cpu").fit(logits, target))
            probs = cal.transform(logits)
            after = float(torch.nn.functional.nll_loss(probs.clamp_min(1e-12).log(), target))
            state = cal._get_state()
            params = (f"T={cal.temperature:.6f}" if kind == "temperature" else
                      f"w={[round(w, 4) for w in state['weight'].tolist()]} "
                      f"b={[round(b, 4) for b in state['bias'].tolist()]}")
            out.append(f"| {n} | Fiducio {theirs.__name__} ({optimizer}) | {params} | {after:.7f} | "
                       f"{float((probs - mine).abs().max()):.1e} | {seconds:.2f} |")
    return out


def near_ties() -> list[str]:
    from mcseg.calibration.scaler_registry import SCALER_TYPES, FitData, build_scaler

    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 20000, generator=g) * 3 + 20
    z[1] = z[0] + torch.rand(20000, generator=g) * 4e-6
    raw = torch.softmax(z, 0).argmax(0)
    out = ["| scaler | voxels whose arg-max moved (of 20000) |", "|---|---|"]
    for t in (0.7, 1.3, 2.9):
        out.append(f"| z / T, T = {t} | {int((torch.softmax(z / t, 0).argmax(0) != raw).sum())} |")
    for name, kind in SCALER_TYPES.items():
        if kind.preserves_argmax and kind.fitted_on == "voxels" and name != "temperature":
            scaler = build_scaler(name)
            scaler.fit(FitData(voxels(3000, k=4)))
            out.append(f"| {name} | {int((torch.softmax(scaler.apply(z), 0).argmax(0) != raw).sum())} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voxels", type=int, nargs="*", default=[200_000])
    parser.add_argument("--near-ties", action="store_true")
    args = parser.parse_args()
    if args.near_ties:
        print("\n".join(near_ties()) + "\n")
    print(f"torch {torch.__version__}, fiducio {fiducio.__version__}, {torch.get_num_threads()} thread(s)\n")
    print("| voxels | fit | parameters | NLL after | max abs diff of p to mcseg's | fit s |")
    print("|---|---|---|---|---|---|")
    for n in args.voxels:
        print("\n".join(rows(n)))


if __name__ == "__main__":
    main()

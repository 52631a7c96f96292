"""Does the clamp of exact zeros change the voxel AUROC of entropy after temperature scaling? (issue #43)

A controlled, synthetic check for docs/results.md ("Calibrating nnU-Net"): nnU-Net's float32 probability files
hold exact zeros (softmax underflow, and p = (1, 0, 0) outside its crop box), which mcseg clamps to 2^-126 before
the log (mcseg.evaluation.folder_posthoc.log_probabilities) and then scales by a temperature. Here the true
logits are known, so the same voxels can be scaled three ways:

- ``logits``: softmax(z / T), from the logits themselves (no file, no clamp);
- ``file, clamp 2^-126``: softmax(ln max(p, 2^-126) / T) with p = the float32 softmax(z), as mcseg does;
- ``file, clamp 1e-6``: the same with the clamp moved to 1e-6, a floor large enough to matter.

For each, the AUROC (mcseg.metrics.failure.auroc, exact, ties half) of the predictive entropy and of 1 - max p
for the error voxels (arg-max differs from the label). The synthetic voxels are not nnU-Net's: three classes,
a per-voxel confidence (1 to 7), Gaussian logit noise (sd 2), one far class per voxel pushed down by 0 to 130 (so that some
float32 softmax values underflow to exactly 0) and 10% of the voxels p = (1, 0, 0) exactly (a crop box).
It answers only whether the clamp moves the AUROC, and whether a temperature alone can lower entropy's AUROC
while leaving 1 - max p's nearly where it was; not what happened in nnU-Net's files (not kept here).

    python scripts/clamp_entropy_auroc.py --out docs/results/nnunet_calibration/clamp_check.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mcseg.evaluation.folder_posthoc import FLOOR, log_probabilities  # noqa: E402
from mcseg.metrics.failure import auroc  # noqa: E402
from mcseg.metrics.uncertainty import entropy  # noqa: E402


def synthetic_voxels(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``3 x n`` float64 logits and ``n`` labels (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    label = torch.multinomial(torch.tensor([0.5, 0.25, 0.25]), n, replacement=True, generator=g)
    confidence = 1.0 + 6.0 * torch.rand(n, generator=g, dtype=torch.float64)
    z = torch.nn.functional.one_hot(label, 3).T.double() * confidence
    z += 2.0 * torch.randn(3, n, generator=g, dtype=torch.float64)
    far = (label + 1 + torch.randint(0, 2, (n,), generator=g)) % 3  # one class other than the label
    z[far, torch.arange(n)] -= 130.0 * torch.rand(n, generator=g, dtype=torch.float64)
    crop = torch.rand(n, generator=g) < 0.10
    z[:, crop] = torch.tensor([200.0, 0.0, 0.0], dtype=torch.float64)[:, None]  # p = (1, 0, 0) in float32
    label[crop] = 0
    return z, label


def scores(probs: torch.Tensor, errors: torch.Tensor) -> dict:
    """AUROC of the entropy and of 1 - max p for the error voxels."""
    return {"auroc_entropy": auroc(entropy(probs), errors),
            "auroc_one_minus_max_p": auroc(1 - probs.max(0).values, errors)}


def check(n: int, seed: int, temperature: float) -> dict:
    z, label = synthetic_voxels(n, seed)
    p32 = torch.softmax(z, 0).float()  # what a tool writes
    errors = p32.argmax(0) != label
    variants = {"raw (float32 file)": p32.double(),
                "logits / T": torch.softmax(z / temperature, 0),
                "file, clamp 2^-126, / T": torch.softmax(log_probabilities(p32, False).double() / temperature, 0),
                "file, clamp 1e-6, / T": torch.softmax(p32.double().clamp_min(1e-6).log() / temperature, 0)}
    result = {name: scores(p, errors) for name, p in variants.items()}
    clamped = variants["file, clamp 2^-126, / T"]
    return {"n_voxels": n, "seed": seed, "temperature": temperature, "clamp": FLOOR,
            "exact_zeros": int((p32 == 0).sum()), "voxels_with_an_exact_zero": int((p32 == 0).any(0).sum()),
            "error_rate": float(errors.double().mean()),
            "max_abs_entropy_difference_logits_vs_clamp": float((entropy(variants["logits / T"])
                                                                  - entropy(clamped)).abs().max()),
            "auroc": result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=400_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--temperature", type=float, default=2.18, help="nnU-Net's fitted T (calibration.json)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = [check(args.n, s, args.temperature) for s in args.seeds]
    text = json.dumps({"script": "scripts/clamp_entropy_auroc.py", "synthetic": True, "runs": results}, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Check ``model=mbls_unet`` against the authors' ``UNet`` (not a test: it needs their code).

    python scripts/check_mbls_unet.py --authors <checkout of github.com/Bala93/MarginLoss>

Builds both at the authors' defaults (1 input channel, 3 classes), compares the parameter count and
every parameter's shape in order, copies the authors' weights into mcseg's network and compares the
outputs on random inputs (batch 8, 64 x 64, and a non-square 96 x 160), and counts the FLOPs of a
forward pass (torch's FlopCounterMode: 2 per multiply-add, convolutions only). Only the authors'
``calibrate/net/unet.py`` is loaded, by path (their package ``__init__`` pulls in training code).
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from mcseg.models import MbLSUNet2D, size_divisor


def authors_unet(root: Path, in_channels: int, classes: int) -> torch.nn.Module:
    path = root / "calibrate" / "net" / "unet.py"
    if not path.is_file():
        raise SystemExit(f"--authors {root}: no calibrate/net/unet.py there")
    spec = importlib.util.spec_from_file_location("authors_unet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.UNet(input_channels=in_channels, num_classes=classes)


def gflop(model: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors", type=Path, required=True, help="root of the authors' repository")
    args = parser.parse_args()
    torch.manual_seed(0)
    theirs, ours = authors_unet(args.authors, 1, 3).eval(), MbLSUNet2D(1, 3).eval()
    p_theirs, p_ours = list(theirs.parameters()), list(ours.parameters())
    n_theirs, n_ours = sum(p.numel() for p in p_theirs), sum(p.numel() for p in p_ours)
    print(f"parameters: authors {n_theirs:,}, mcseg {n_ours:,}; size divisor (mcseg) {size_divisor(ours)}")
    assert n_theirs == n_ours, "parameter counts differ"
    # their registration order: down, up (shallowest first), head; ours: down, up (shallowest first), head
    assert [p.shape for p in p_theirs] == [p.shape for p in p_ours], "parameter shapes differ"
    with torch.no_grad():
        for a, b in zip(p_theirs, p_ours):
            b.copy_(a)
        for shape in [(8, 1, 64, 64), (2, 1, 96, 160)]:
            x = torch.randn(shape)
            want, got = theirs(x), ours(x)
            assert got.shape == want.shape, (got.shape, want.shape)
            print(f"input {shape}: output {tuple(got.shape)}, max |difference| {(got - want).abs().max().item():.2e}")
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    x = torch.randn(8, 1, 64, 64)
    print(f"GFLOP per forward pass at 8 x 1 x 64 x 64: authors {gflop(theirs, x):.2f}, mcseg {gflop(ours, x):.2f}")


if __name__ == "__main__":
    main()

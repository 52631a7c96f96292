"""The 2D U-Net of the margin-loss segmentation study (Murugesan et al., "Calibrating segmentation
networks with margin-based label smoothing", MedIA 2023): ``UNet`` of the authors'
``calibrate/net/unet.py`` (github.com/Bala93/MarginLoss), written here from its architecture.

The network, at the authors' defaults (``filters_base=32``, factors ``(1, 2, 4, 8, 16)``,
``bottom_s=4``, ``padding=1``):

- five encoder levels of 32-64-128-256-512 channels, each two 3x3 convolutions (padding 1, with
  bias), each followed by ReLU; **no normalisation** (their ``Conv3BN`` has ``bn=False``);
- max-pooling by 2 before levels 2, 3 and 4, and by **4** (``bottom_s``) before the bottom level,
  so the total downsampling, and the size divisor, is 2 x 2 x 2 x 4 = **32**;
- in the decoder, upsampling by nearest neighbour **without a convolution** (by 4 from the bottom,
  by 2 above), concatenated as ``[upsampled, skip]`` and merged by two 3x3 convolutions + ReLU to
  the level's channels (the decoder's widths equal the encoder's by default: ``up_channels``);
- a 1x1 convolution head (their ``nn.Conv2d(32, num_classes, padding)`` passes ``padding=1`` as the
  kernel size), returning logits (their softmax is commented out).

Parameters, for 1 input channel and K classes: encoder 4,711,648, decoder 3,134,400, head 33 K;
with K = 3, 7,846,147 (7.85 M, as the issue measured on the authors' code).

Arguments in mcseg's names: ``channels`` = ``filters_base * down_filter_factors``,
``up_channels`` = ``filters_base * up_filter_factors`` (None: equal to ``channels``; the last must
equal the last of ``channels``, as the authors assert), ``bottom_pool`` = ``bottom_s``.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F


def _two_convs(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True),
    )


class MbLSUNet2D(nn.Module):
    """U-Net 2D; input ``B x in_channels x H x W`` with H, W divisible by :attr:`size_divisor`
    (``2**(len(channels)-2) * bottom_pool``: 32 at the defaults); output ``B x out_channels x H x W`` logits."""

    def __init__(self, in_channels: int, out_channels: int, channels: Sequence[int] = (32, 64, 128, 256, 512),
                 up_channels: Sequence[int] | None = None, bottom_pool: int = 4) -> None:
        super().__init__()
        channels = [int(c) for c in channels]
        up_channels = channels if up_channels is None else [int(c) for c in up_channels]
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"model: in_channels={in_channels}, out_channels={out_channels} must be >= 1")
        if len(channels) < 2 or min(channels) < 1:
            raise ValueError(f"model.channels={channels}: need at least two levels, each of >= 1 channel")
        if len(up_channels) != len(channels) or up_channels[-1] != channels[-1] or min(up_channels) < 1:
            raise ValueError(f"model.up_channels={up_channels}: one width per level of model.channels={channels}, "
                             "the last (the bottom level's) equal to its last")
        if int(bottom_pool) < 1:
            raise ValueError(f"model.bottom_pool={bottom_pool}: must be >= 1")
        self.bottom_pool = int(bottom_pool)
        # pooling before each level (level 0 sees the input); the decoder upsamples by the same factors
        self.factors = [1] + [2] * (len(channels) - 2) + [self.bottom_pool]
        self.size_divisor = 2 ** (len(channels) - 2) * self.bottom_pool
        self.down = nn.ModuleList(_two_convs(cin, cout) for cin, cout in zip([in_channels, *channels[:-1]], channels))
        # level i merges [upsampled level i+1 (up_channels[i+1]), skip (channels[i])] into up_channels[i]
        self.up = nn.ModuleList(_two_convs(channels[i] + up_channels[i + 1], up_channels[i])
                                for i in range(len(channels) - 1))
        self.head = nn.Conv2d(up_channels[0], out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for factor, block in zip(self.factors, self.down):
            x = block(x if factor == 1 else F.max_pool2d(x, factor))
            skips.append(x)
        for i in reversed(range(len(self.up))):
            x = F.interpolate(x, scale_factor=self.factors[i + 1], mode="nearest")
            x = self.up[i](torch.cat([x, skips[i]], dim=1))
        return self.head(x)

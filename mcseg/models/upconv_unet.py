"""A plain 2D U-Net whose decoder upsamples with a convolution (``model=upconv_unet``).

Five levels of 32-64-128-256-512 channels, each two 3x3 convolutions with ReLU and no
normalisation, 2x2 max-pooling down, nearest-neighbour upsampling followed by a 3x3
convolution (and ReLU) up, skip connections by concatenation and a 1x1 head: the shape of
Ronneberger et al.'s U-Net (MICCAI 2015, "up-convolution" halving the channels), with padded
convolutions. Until issue #25 this was ``model=mbls_unet``, documented as the margin-loss
study's U-Net, which it is not (that network, :class:`mcseg.models.MbLSUNet2D`, upsamples
without a convolution and pools by 4 at the bottom); it is kept for the runs made with it and
as a U-Net without normalisation that pools by 2 only (size divisor 16 at the default depth).
With 1 input channel and 3 classes it has 8,629,987 parameters (8.63 M).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True),
    )


class UpConvUNet2D(nn.Module):
    """U-Net 2D; input ``B x in_channels x H x W`` with H, W divisible by ``2**(len(channels)-1)``."""

    def __init__(self, in_channels: int, out_channels: int, channels: Sequence[int] = (32, 64, 128, 256, 512)) -> None:
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"model: in_channels={in_channels}, out_channels={out_channels} must be >= 1")
        if len(channels) < 2:
            raise ValueError(f"model.channels={list(channels)}: need at least two levels")
        self.size_divisor = 2 ** (len(channels) - 1)
        self.down = nn.ModuleList()
        prev = in_channels
        for ch in channels:
            self.down.append(_double_conv(prev, ch))
            prev = ch
        self.pool = nn.MaxPool2d(2)
        self.up_convs = nn.ModuleList()
        self.merge = nn.ModuleList()
        for ch_hi, ch_lo in zip(channels[::-1][:-1], channels[::-1][1:]):
            self.up_convs.append(nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"),
                                               nn.Conv2d(ch_hi, ch_lo, 3, padding=1), nn.ReLU(inplace=True)))
            self.merge.append(_double_conv(2 * ch_lo, ch_lo))
        self.head = nn.Conv2d(channels[0], out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        for up, merge, skip in zip(self.up_convs, self.merge, skips[-2::-1]):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)

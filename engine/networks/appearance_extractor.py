"""Ditto's appearance extractor (LivePortrait F): a 256x256 RGB portrait to the 3-D feature f_s.

The module tree reproduces the official ``appearance_extractor.pth`` key for key (107 keys,
BatchNorm running statistics included), so the official file loads strictly.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from engine.networks.folding import fold_batchnorm_into_conv, randomize_batchnorm

PUBLISHED_WIDTHS: tuple[int, ...] = (64, 128, 256)
PUBLISHED_VOLUME: tuple[int, int] = (32, 16)
PUBLISHED_RESBLOCKS = 6


class ConvBnRelu(nn.Module):
    """3x3 conv, BatchNorm, ReLU, then an optional 2x2 average pool (``first`` and ``down_blocks.i``)."""

    def __init__(self, in_channels: int, out_channels: int, pool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm: nn.Module = nn.BatchNorm2d(out_channels)
        self.pool: nn.Module = nn.AvgPool2d(2) if pool else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.norm(self.conv(x))))

    def fold(self) -> None:
        """Merge the eval-mode BatchNorm into the conv."""
        fold_batchnorm_into_conv(self.conv, self.norm)
        self.norm = nn.Identity()


class PreActResBlock3d(nn.Module):
    """Pre-activation residual block: x + conv2(relu(norm2(conv1(relu(norm1(x))))))."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(channels, channels, kernel_size=3, padding=1)
        self.conv2 = nn.Conv3d(channels, channels, kernel_size=3, padding=1)
        self.norm1 = nn.BatchNorm3d(channels)
        self.norm2: nn.Module = nn.BatchNorm3d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(F.relu(self.norm1(x)))
        return x + self.conv2(F.relu(self.norm2(y)))

    def fold(self) -> None:
        """Merge norm2 into conv1; norm1 acts on the residual stream and has no conv to fold into."""
        fold_batchnorm_into_conv(self.conv1, self.norm2)
        self.norm2 = nn.Identity()


class AppearanceFeatureExtractor(nn.Module):
    """RGB image (B,3,H,W) in [0,1] -> appearance volume (B,C,D,H/4,W/4); published (B,32,16,64,64)."""

    def __init__(
        self,
        image_channels: int = 3,
        widths: tuple[int, ...] = PUBLISHED_WIDTHS,
        volume: tuple[int, int] = PUBLISHED_VOLUME,
        num_resblocks: int = PUBLISHED_RESBLOCKS,
    ) -> None:
        super().__init__()
        self.image_channels = image_channels
        self.volume = volume
        self.first = ConvBnRelu(image_channels, widths[0], pool=False)
        self.down_blocks = nn.ModuleList(ConvBnRelu(cin, cout, pool=True) for cin, cout in zip(widths[:-1], widths[1:]))
        self.second = nn.Conv2d(widths[-1], volume[0] * volume[1], kernel_size=1)
        self.resblocks_3d = nn.Sequential()
        for i in range(num_resblocks):
            self.resblocks_3d.add_module(f"3dr{i}", PreActResBlock3d(volume[0]))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        factor = 2 ** len(self.down_blocks)
        if (
            image.dim() != 4
            or image.shape[1] != self.image_channels
            or image.shape[2] % factor
            or image.shape[3] % factor
        ):
            raise ValueError(
                f"appearance extractor expects an RGB batch (B,{self.image_channels},H,W) with H and W "
                f"divisible by {factor} (the official size is 256x256), got {tuple(image.shape)}"
            )
        x = self.first(image)
        for block in self.down_blocks:
            x = block(x)
        volume = self.second(x).unflatten(1, self.volume)
        return self.resblocks_3d(volume)


def build(state_dict: Mapping[str, torch.Tensor] | None = None) -> AppearanceFeatureExtractor:
    """The extractor with the published shapes, or shaped after ``state_dict``'s tensors."""
    if state_dict is None:
        return AppearanceFeatureExtractor()
    first = state_dict["first.conv.weight"]
    widths = [first.shape[0]]
    while f"down_blocks.{len(widths) - 1}.conv.weight" in state_dict:
        widths.append(state_dict[f"down_blocks.{len(widths) - 1}.conv.weight"].shape[0])
    num_resblocks = 0
    while f"resblocks_3d.3dr{num_resblocks}.conv1.weight" in state_dict:
        num_resblocks += 1
    channels = state_dict["resblocks_3d.3dr0.conv1.weight"].shape[0]
    depth, remainder = divmod(state_dict["second.weight"].shape[0], channels)
    if remainder:
        raise ValueError(f"second conv width {state_dict['second.weight'].shape[0]} is not a multiple of {channels}")
    return AppearanceFeatureExtractor(first.shape[1], tuple(widths), (channels, depth), num_resblocks)


@torch.no_grad()
def randomize(module: AppearanceFeatureExtractor, generator: torch.Generator) -> None:
    """He-initialised convs and trained-looking BatchNorm statistics; residual branches damped so f_s stays O(0.1-1)."""
    for name, sub in module.named_modules():
        if isinstance(sub, (nn.Conv2d, nn.Conv3d)):
            fan_in = sub.weight[0].numel()
            gain = 0.3 if name.endswith("conv2") else 1.0
            sub.weight.copy_(torch.randn(sub.weight.shape, generator=generator) * gain * (2.0 / fan_in) ** 0.5)
            sub.bias.copy_(0.05 * torch.randn(sub.bias.shape, generator=generator))
        elif isinstance(sub, nn.modules.batchnorm._BatchNorm):
            randomize_batchnorm(sub, generator)


def finalize(module: AppearanceFeatureExtractor, fold_batchnorm: bool) -> None:
    """Fold every conv->BatchNorm pair (first, down blocks, each resblock's norm2) when asked."""
    if not fold_batchnorm:
        return
    module.eval()
    for sub in list(module.modules()):
        if isinstance(sub, (ConvBnRelu, PreActResBlock3d)):
            sub.fold()

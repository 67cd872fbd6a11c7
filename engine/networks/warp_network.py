"""Ditto's warp network (LivePortrait W): warps the appearance volume f_s from source to driving keypoints.

The module tree reproduces the official ``warp_network.pth`` key for key (97 keys, BatchNorm
running statistics included), so the official file loads strictly. Output (B,256,64,64) is the
decoder's input.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from engine.networks.dense_motion import (
    PUBLISHED_COMPRESSED,
    PUBLISHED_DEPTH,
    PUBLISHED_FEATURE_CHANNELS,
    PUBLISHED_HOURGLASS_WIDTHS,
    PUBLISHED_NUM_KP,
    DenseMotionNetwork,
    VolumeSampler,
    fold_pair,
    sample_volume,
)
from engine.networks.folding import randomize_batchnorm

PUBLISHED_OUT_CHANNELS = 256

# Weight gains of the random stand-in weights (randomize): spread-out mask and occlusion, not saturated.
_MASK_GAIN = 4.0
_OCCLUSION_GAIN = 5.0


class SameBlock2d(nn.Module):
    """Conv2d k3, BatchNorm, LeakyReLU(0.01): the ``third`` block, from C*D stacked channels to the output width."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm: nn.Module = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.norm(self.conv(x)), negative_slope=0.01)


class WarpingNetwork(nn.Module):
    """f_s (B,C,D,H,W) and keypoints (B,K,3) as (x,y,z) -> warped, occlusion-masked feature (B,out,H,W).

    ``sample_volume`` performs both trilinear grid samples; export code may replace it on the
    instance (same signature and convention) with an implementation its target supports.
    """

    def __init__(
        self,
        num_kp: int = PUBLISHED_NUM_KP,
        feature_channels: int = PUBLISHED_FEATURE_CHANNELS,
        depth: int = PUBLISHED_DEPTH,
        compressed: int = PUBLISHED_COMPRESSED,
        hourglass_widths: tuple[int, ...] = PUBLISHED_HOURGLASS_WIDTHS,
        out_channels: int = PUBLISHED_OUT_CHANNELS,
    ) -> None:
        super().__init__()
        self.num_kp = num_kp
        self.volume = (feature_channels, depth)
        self.pooling = 2 ** (len(hourglass_widths) - 1)
        self.dense_motion_network = DenseMotionNetwork(num_kp, feature_channels, depth, compressed, hourglass_widths)
        self.third = SameBlock2d(feature_channels * depth, out_channels)
        self.fourth = nn.Conv2d(out_channels, out_channels, kernel_size=1)
        self.sample_volume: VolumeSampler = sample_volume

    def forward(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        self._check_inputs(feature_3d, kp_source, kp_driving)
        motion = self.dense_motion_network(feature_3d, kp_source, kp_driving, self.sample_volume)
        grid = motion.deformation
        warped = self.sample_volume(feature_3d.to(grid.dtype), grid).to(feature_3d.dtype)
        out = self.fourth(self.third(warped.flatten(1, 2)))
        return out * motion.occlusion

    def _check_inputs(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> None:
        channels, depth = self.volume
        shape = tuple(feature_3d.shape)
        if len(shape) != 5 or shape[1:3] != (channels, depth) or shape[3] % self.pooling or shape[4] % self.pooling:
            raise ValueError(
                f"warp network expects feature_3d of shape (B,{channels},{depth},H,W) with H and W divisible by "
                f"{self.pooling} (the appearance feature is (B,32,16,64,64)), got {shape}"
            )
        expected = (shape[0], self.num_kp, 3)
        for name, kp in (("kp_source", kp_source), ("kp_driving", kp_driving)):
            if tuple(kp.shape) != expected:
                raise ValueError(
                    f"warp network expects {name} of shape {expected} (B,{self.num_kp} keypoints,(x,y,z)) "
                    f"to match feature_3d's batch, got {tuple(kp.shape)}"
                )


def build(state_dict: Mapping[str, torch.Tensor] | None = None) -> WarpingNetwork:
    """The warp network with the published shapes, or shaped after ``state_dict``'s tensors."""
    if state_dict is None:
        return WarpingNetwork()
    prefix = "dense_motion_network."
    compress = state_dict[prefix + "compress.weight"]
    widths = []
    while f"{prefix}hourglass.encoder.down_blocks.{len(widths)}.conv.weight" in state_dict:
        widths.append(state_dict[f"{prefix}hourglass.encoder.down_blocks.{len(widths)}.conv.weight"].shape[0])
    base = state_dict[f"{prefix}hourglass.decoder.up_blocks.{len(widths) - 1}.conv.weight"].shape[0]
    hourglass_out = state_dict[prefix + "hourglass.decoder.conv.weight"].shape[0]
    depth, remainder = divmod(state_dict[prefix + "occlusion.weight"].shape[1], hourglass_out)
    if remainder:
        raise ValueError(f"occlusion input width is not a multiple of the hourglass output width {hourglass_out}")
    return WarpingNetwork(
        num_kp=state_dict[prefix + "mask.weight"].shape[0] - 1,
        feature_channels=compress.shape[1],
        depth=depth,
        compressed=compress.shape[0],
        hourglass_widths=(base, *widths),
        out_channels=state_dict["fourth.weight"].shape[0],
    )


@torch.no_grad()
def randomize(module: WarpingNetwork, generator: torch.Generator) -> None:
    """He-initialised convs, trained-looking BatchNorm statistics; mask and occlusion heads scaled to stay
    unsaturated."""
    dense = module.dense_motion_network
    gains = {dense.mask: _MASK_GAIN, dense.occlusion: _OCCLUSION_GAIN}
    for sub in module.modules():
        if isinstance(sub, (nn.Conv2d, nn.Conv3d)):
            fan_in = sub.weight[0].numel()
            gain = gains.get(sub, 2.0**0.5)
            sub.weight.copy_(torch.randn(sub.weight.shape, generator=generator) * gain / fan_in**0.5)
            sub.bias.copy_(0.05 * torch.randn(sub.bias.shape, generator=generator))
        elif isinstance(sub, nn.modules.batchnorm._BatchNorm):
            randomize_batchnorm(sub, generator)


def finalize(module: WarpingNetwork, fold_batchnorm: bool) -> None:
    """Fold all twelve conv->BatchNorm pairs (compress, hourglass, third) when asked."""
    if not fold_batchnorm:
        return
    module.eval()
    module.dense_motion_network.fold()
    fold_pair(module.third)

"""Dense motion of Ditto's warp network: per-keypoint translations blended into one deformation field.

The geometry (coordinate grid, sparse motions, heatmaps, both grid samples, the softmax blend)
runs in float32 even when the convolutions run in half precision, as the reference's autocast
path does: fp16 grid coordinates would be off by up to 0.016 voxel near the volume's edges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.networks.depth_planes import PlanesConv3d, PlanesHeads
from engine.networks.folding import fold_batchnorm_into_conv

PUBLISHED_NUM_KP = 21
PUBLISHED_FEATURE_CHANNELS = 32
PUBLISHED_DEPTH = 16
PUBLISHED_COMPRESSED = 4
PUBLISHED_HOURGLASS_WIDTHS: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
KP_VARIANCE = 0.01

VolumeSampler = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sample_volume(volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Trilinear sample of ``volume`` (N,C,D,H,W) at ``grid`` (N,D',H',W',3) of (x,y,z) in [-1,1].

    Zeros outside, align_corners=False (-1 and 1 are the outer faces of the edge voxels). Both of
    the warp's samples go through here, so export code can substitute a gather-based version.
    """
    return F.grid_sample(volume, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def coordinate_grid(depth: int, height: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(D,H,W,3) grid of (x,y,z), x along W, y along H, z along D, each from -1 to 1 corner-inclusive."""

    def axis(n: int) -> torch.Tensor:
        return 2 * (torch.arange(n, dtype=dtype, device=device) / (n - 1)) - 1

    z, y, x = torch.meshgrid(axis(depth), axis(height), axis(width), indexing="ij")
    return torch.stack([x, y, z], dim=-1)


def sparse_motions(grid: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
    """(B,1+K,D,H,W,3): the identity grid first, then per keypoint the grid shifted by kp_source - kp_driving."""
    shifted = grid - kp_driving[:, :, None, None, None, :] + kp_source[:, :, None, None, None, :]
    identity = grid.expand(kp_source.shape[0], 1, *grid.shape)
    return torch.cat([identity, shifted], dim=1)


def keypoint_heatmaps(grid: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
    """(B,1+K,D,H,W): a zero background channel, then G(kp_driving) - G(kp_source), G = exp(-|grid-kp|^2 / 2v)."""

    def gaussian(kp: torch.Tensor) -> torch.Tensor:
        squared = ((grid - kp[:, :, None, None, None, :]) ** 2).sum(-1)
        return torch.exp(-0.5 * squared / KP_VARIANCE)

    heat = gaussian(kp_driving) - gaussian(kp_source)
    return torch.cat([torch.zeros_like(heat[:, :1]), heat], dim=1)


def motion_features(
    feature: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor, sample: VolumeSampler = sample_volume
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hourglass input (B,(1+K)*(1+C),D,H,W) and the sparse motions (B,1+K,D,H,W,3), in the keypoints' dtype.

    The input holds 1+K groups (background first), each a heatmap followed by the C channels of
    ``feature`` (B,C,D,H,W) sampled along that group's motion.
    """
    batch, channels, depth, height, width = feature.shape
    grid = coordinate_grid(depth, height, width, kp_source.dtype, feature.device)
    motions = sparse_motions(grid, kp_source, kp_driving)
    groups = motions.shape[1]
    # One sample call for all groups: their grids are stacked along the output depth.
    stacked = sample(feature.to(kp_source.dtype), motions.reshape(batch, groups * depth, height, width, 3))
    deformed = stacked.view(batch, channels, groups, depth, height, width).transpose(1, 2)
    heatmaps = keypoint_heatmaps(grid, kp_source, kp_driving).unsqueeze(2)
    return torch.cat([heatmaps, deformed], dim=2).flatten(1, 2), motions


def blend_motions(mask_logits: torch.Tensor, motions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax ``mask_logits`` (B,1+K,D,H,W) over the groups; the deformation (B,D,H,W,3) is the mask-weighted motion
    sum."""
    mask = torch.softmax(mask_logits, dim=1)
    return mask, (mask.unsqueeze(-1) * motions).sum(dim=1)


def fold_pair(owner: nn.Module, conv: str = "conv", norm: str = "norm") -> None:
    """Fold ``owner.<norm>`` (eval-mode BatchNorm) into ``owner.<conv>`` and drop the norm."""
    fold_batchnorm_into_conv(getattr(owner, conv), getattr(owner, norm))
    setattr(owner, norm, nn.Identity())


class DownBlock3d(nn.Module):
    """Conv3d k3, BatchNorm, ReLU, then average pooling of H and W by 2 (depth is never pooled)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm: nn.Module = nn.BatchNorm3d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.conv(x)))
        # A 2-D pool over (C*D) planes equals avg_pool3d with kernel (1,2,2) and also runs in fp16 on the CPU.
        return F.avg_pool2d(x.flatten(1, 2), kernel_size=2).unflatten(1, x.shape[1:3])


class UpBlock3d(nn.Module):
    """Nearest upsampling of H and W by 2, then Conv3d k3, BatchNorm, ReLU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm: nn.Module = nn.BatchNorm3d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest")
        return F.relu(self.norm(self.conv(x)))


class HourglassEncoder(nn.Module):
    """Down blocks to ``widths[1:]``; returns the input and every block's output (the decoder's skips)."""

    def __init__(self, in_channels: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        inputs = (in_channels, *widths[1:-1])
        self.down_blocks = nn.ModuleList(DownBlock3d(cin, cout) for cin, cout in zip(inputs, widths[1:]))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = [x]
        for block in self.down_blocks:
            outs.append(block(outs[-1]))
        return outs


class HourglassDecoder(nn.Module):
    """Up blocks back to ``widths[0]``, each output concatenated with the encoder's skip, then Conv3d-BN-ReLU."""

    def __init__(self, in_channels: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        levels = range(len(widths) - 2, -1, -1)
        self.up_blocks = nn.ModuleList(
            UpBlock3d(widths[i + 1] * (1 if i == len(widths) - 2 else 2), widths[i]) for i in levels
        )
        self.out_channels = widths[0] + in_channels
        self.conv = nn.Conv3d(self.out_channels, self.out_channels, kernel_size=3, padding=1)
        self.norm: nn.Module = nn.BatchNorm3d(self.out_channels)

    def forward(self, skips: list[torch.Tensor]) -> torch.Tensor:
        out = skips[-1]
        for block, skip in zip(self.up_blocks, reversed(skips[:-1])):
            out = torch.cat([block(out), skip], dim=1)
        return F.relu(self.norm(self.conv(out)))


class Hourglass(nn.Module):
    """3-D U-Net over (D,H,W) pooling only H and W; output channels widths[0] + in_channels."""

    def __init__(self, in_channels: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.encoder = HourglassEncoder(in_channels, widths)
        self.decoder = HourglassDecoder(in_channels, widths)
        self.out_channels = self.decoder.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))

    def fold(self) -> None:
        """Fold every conv->BatchNorm pair of the encoder and decoder."""
        for block in [*self.encoder.down_blocks, *self.decoder.up_blocks, self.decoder]:
            fold_pair(block)


class DenseMotion(NamedTuple):
    """What the dense motion network predicts for a batch."""

    mask: torch.Tensor  # (B,1+K,D,H,W) softmax weights of the sparse motions, float32
    deformation: torch.Tensor  # (B,D,H,W,3) sampling grid of (x,y,z), float32
    occlusion: torch.Tensor  # (B,1,H,W) in (0,1), the convolutions' dtype


class DenseMotionNetwork(nn.Module):
    """Appearance volume + keypoints -> blend mask, deformation grid and occlusion map (keys
    ``dense_motion_network.*``)."""

    def __init__(
        self,
        num_kp: int = PUBLISHED_NUM_KP,
        feature_channels: int = PUBLISHED_FEATURE_CHANNELS,
        depth: int = PUBLISHED_DEPTH,
        compressed: int = PUBLISHED_COMPRESSED,
        hourglass_widths: tuple[int, ...] = PUBLISHED_HOURGLASS_WIDTHS,
    ) -> None:
        super().__init__()
        self.hourglass = Hourglass((num_kp + 1) * (compressed + 1), hourglass_widths)
        self.mask = nn.Conv3d(self.hourglass.out_channels, num_kp + 1, kernel_size=7, padding=3)
        self.compress = nn.Conv3d(feature_channels, compressed, kernel_size=1)
        self.norm: nn.Module = nn.BatchNorm3d(compressed)
        self.occlusion = nn.Conv2d(self.hourglass.out_channels * depth, 1, kernel_size=7, padding=3)
        self.planes_heads: PlanesHeads | None = None

    def forward(
        self,
        feature: torch.Tensor,
        kp_source: torch.Tensor,
        kp_driving: torch.Tensor,
        sample: VolumeSampler = sample_volume,
    ) -> DenseMotion:
        geometry = torch.promote_types(kp_source.dtype, torch.float32)
        compressed = F.relu(self.norm(self.compress(feature)))
        inputs, motions = motion_features(compressed, kp_source.to(geometry), kp_driving.to(geometry), sample)
        prediction = self.hourglass(inputs.to(feature.dtype))
        mask_logits, occlusion_logits = self.heads(prediction)
        mask, deformation = blend_motions(mask_logits.to(geometry), motions)
        return DenseMotion(mask, deformation, torch.sigmoid(occlusion_logits))

    def heads(self, prediction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The hourglass output (B,C,D,H,W) -> mask logits (B,1+K,D,H,W) and occlusion logits (B,1,H,W)."""
        if self.planes_heads is not None:
            return self.planes_heads(prediction)
        return self.mask(prediction), self.occlusion(prediction.flatten(1, 2))

    def use_depth_planes(self) -> None:
        """Compute every 3-D convolution over depth planes (faster cuDNN kernels on CUDA; see depth_planes)."""
        for block in [*self.hourglass.encoder.down_blocks, *self.hourglass.decoder.up_blocks, self.hourglass.decoder]:
            block.conv = PlanesConv3d(block.conv)
        self.planes_heads = PlanesHeads(self.mask, self.occlusion, self.occlusion.in_channels // self.mask.in_channels)

    def fold(self) -> None:
        """Fold compress->norm and every hourglass conv->BatchNorm pair."""
        fold_pair(self, "compress", "norm")
        self.hourglass.fold()

"""The warp network's 3-D convolutions as 2-D convolutions over depth planes, for cuDNN's fast kernels.

A k×k×k convolution whose depth is padded by k//2 equals one 2-D k×k convolution applied to
every depth plane, with the k depth slices of the kernel stacked along its output channels,
followed by a shifted sum: output plane d adds input plane d+dz−k//2's slice-dz contribution.
cuDNN runs that 2-D form at a much higher rate than its 3-D kernels. Channels are zero-padded to
the tensor cores' multiples (inputs 16, outputs 8), which adds exact zeros. The occlusion head
(a 2-D 7×7 convolution over all 16 depth planes stacked as channels, one output) rides along in
the mask's 2-D convolution: each plane's contribution is one more output channel per depth,
summed along the diagonal. That 7×7 convolution (144 -> 184 channels) gets only cuDNN's slower
"indexed" kernels; with the input's 7 column shifts stacked as channels (1008) it becomes a 7×1
convolution that cuDNN runs about twice as fast, and torch.compile fuses the stacking copy into
the producer of the input.

Only the PyTorch backend on CUDA swaps these in (``use_depth_planes``); checkpoints, the CPU
path and the ONNX export keep the plain 3-D operators (TensorRT picks its own kernels).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

INPUT_MULTIPLE = 16
OUTPUT_MULTIPLE = 8


def _round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


def stacked_weight(weight: torch.Tensor, out_channels: int, in_channels: int) -> torch.Tensor:
    """(O,C,k,k,k) -> (k·out_channels, in_channels, k, k): depth slices stacked along outputs, zero-padded."""
    o, c, k = weight.shape[:3]
    slices = F.pad(weight.permute(2, 0, 1, 3, 4), (0, 0, 0, 0, 0, in_channels - c, 0, out_channels - o))
    return slices.reshape(k * out_channels, in_channels, k, k)


def as_planes(x: torch.Tensor, channels: int) -> torch.Tensor:
    """(B,C,D,H,W) -> (B·D, channels, H, W), zero channels appended; a view when x is channels-last-3d and unpadded."""
    batch, c, depth, height, width = x.shape
    if channels > c:
        x = F.pad(x, (0, 0, 0, 0, 0, 0, 0, channels - c))
    return x.permute(0, 2, 1, 3, 4).reshape(batch * depth, channels, height, width)


def column_stack(x: torch.Tensor, k: int) -> torch.Tensor:
    """(N,C,H,W) -> (N,k·C,H,W): channel block j is x shifted by j−k//2 columns, zeros outside."""
    width = x.shape[-1]
    padded = F.pad(x, (k // 2, k // 2))
    return torch.cat([padded[..., j : j + width] for j in range(k)], dim=1).contiguous(
        memory_format=torch.channels_last
    )


def column_weight(weight: torch.Tensor) -> torch.Tensor:
    """(O,C,k,k) -> (O,k·C,k,1): a k×k convolution's weight for a ``column_stack``-ed input."""
    o, c, k = weight.shape[:3]
    return weight.permute(0, 3, 1, 2).reshape(o, k * c, k, 1)


def shifted_sum(y: torch.Tensor, batch: int, k: int, stacked: int, out_channels: int) -> torch.Tensor:
    """Per-plane contributions (B·D, k·stacked, H, W) -> (B, out_channels, D, H, W): plane d sums slice dz of plane
    d+dz−k//2."""
    planes, _, height, width = y.shape
    depth = planes // batch
    y = y.permute(0, 2, 3, 1).reshape(batch, depth, height, width, k, stacked)
    p = k // 2
    y = F.pad(y, (0, 0, 0, 0, 0, 0, 0, 0, p, p))
    out = y[:, 0:depth, :, :, 0, :out_channels]
    for dz in range(1, k):
        out = out + y[:, dz : dz + depth, :, :, dz, :out_channels]
    return out.permute(0, 4, 1, 2, 3)


class PlanesConv3d(nn.Module):
    """A cubic-kernel ``nn.Conv3d`` (stride 1, padding k//2) computed over depth planes; same function, same layout."""

    def __init__(self, conv: nn.Conv3d) -> None:
        super().__init__()
        k = conv.kernel_size[0]
        if (
            conv.kernel_size != (k, k, k)
            or conv.padding != (k // 2,) * 3
            or conv.stride != (1, 1, 1)
            or conv.groups != 1
        ):
            raise ValueError(f"only cubic, stride-1, same-padded convolutions go to depth planes, got {conv}")
        self.k = k
        self.out_channels = conv.out_channels
        self.in_padded = _round_up(conv.in_channels, INPUT_MULTIPLE)
        self.stacked = _round_up(conv.out_channels, OUTPUT_MULTIPLE)
        weight = stacked_weight(conv.weight.detach(), self.stacked, self.in_padded)
        bias = (
            conv.bias.detach()
            if conv.bias is not None
            else torch.zeros(conv.out_channels, device=weight.device, dtype=weight.dtype)
        )
        self.register_buffer("weight", _fast_layout(weight), persistent=False)
        self.register_buffer("bias", bias.clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(as_planes(x, self.in_padded), self.weight, padding=self.k // 2)
        return shifted_sum(y, x.shape[0], self.k, self.stacked, self.out_channels) + self.bias.view(-1, 1, 1, 1)


class PlanesHeads(nn.Module):
    """The dense motion's mask (3-D k7) and occlusion (2-D k7 over C·D channels) convolutions as one 2-D convolution."""

    def __init__(self, mask: nn.Conv3d, occlusion: nn.Conv2d, depth: int) -> None:
        super().__init__()
        k = mask.kernel_size[0]
        if (
            occlusion.out_channels != 1
            or occlusion.kernel_size != (k, k)
            or occlusion.in_channels != mask.in_channels * depth
        ):
            raise ValueError(
                "the occlusion head must be a single-output k×k convolution over the mask input's C·D channels"
            )
        self.k = k
        self.depth = depth
        self.mask_channels = mask.out_channels
        self.in_padded = _round_up(mask.in_channels, INPUT_MULTIPLE)
        self.stacked = _round_up(mask.out_channels, OUTPUT_MULTIPLE)
        mask_weight = stacked_weight(mask.weight.detach(), self.stacked, self.in_padded)
        # Occlusion input channel c·D + d is channel c of depth plane d: one output per plane d.
        occ = occlusion.weight.detach().reshape(mask.in_channels, depth, k, k).transpose(0, 1)
        occ = F.pad(occ, (0, 0, 0, 0, 0, self.in_padded - mask.in_channels))
        self.register_buffer("weight", _fast_layout(column_weight(torch.cat([mask_weight, occ]))), persistent=False)
        self.register_buffer("mask_bias", mask.bias.detach().clone(), persistent=False)
        self.register_buffer("occlusion_bias", occlusion.bias.detach().clone(), persistent=False)

    def forward(self, prediction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,C,D,H,W) -> mask logits (B,22,D,H,W) and occlusion logits (B,1,H,W)."""
        batch, _, depth, height, width = prediction.shape
        columns = column_stack(as_planes(prediction, self.in_padded), self.k)
        y = F.conv2d(columns, self.weight, padding=(self.k // 2, 0))
        split = self.k * self.stacked
        mask = shifted_sum(y[:, :split], batch, self.k, self.stacked, self.mask_channels)
        per_plane = y[:, split:].reshape(batch, depth, depth, height, width)
        occlusion = torch.diagonal(per_plane, dim1=1, dim2=2).sum(dim=-1)
        return mask + self.mask_bias.view(-1, 1, 1, 1), (occlusion + self.occlusion_bias).unsqueeze(1)


def _fast_layout(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous(memory_format=torch.channels_last)

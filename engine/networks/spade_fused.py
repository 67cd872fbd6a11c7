"""The decoder's SPADE layers as fewer, smaller convolutions: the same function, for the GPU.

A SPADE's gamma and beta depend only on its segmap, never on the activation it modulates, and
every SPADE of the decoder reads the warped feature at one of three resolutions. Three exact
rewrites follow (``SPADEDecoder.use_fused_spade``), and a fourth on top of them for the
shortcuts (``SPADEDecoder.use_composed_shortcuts``):

1. All ``mlp_shared`` convolutions at one resolution run once per frame as one convolution with
   stacked outputs (64x64: the 12 SPADEs of the middle blocks; 128x128 and 256x256: the three of
   ``up_0`` / ``up_1``); each SPADE reads its 128 channels of that hidden map.
2. Each SPADE's ``mlp_gamma`` and ``mlp_beta`` run as one convolution with 2C outputs.
3. The 128x128 and 256x256 segmaps are nearest upsamplings (x2, x4) of the 64x64 feature, so a
   3x3 convolution over them is, per output phase (a, b), a convolution over the 64x64 feature
   whose taps landing on the same source pixel are summed: 2 taps per axis for the border
   phases (0 and s-1), 1 for the inner ones. Phases with the same kernel size share one
   convolution with stacked outputs (x2: one 2x2; x4: 2x2, 2x1, 1x2, 1x1, each 4 phases), and
   ``pixel_shuffle`` interleaves them: 16/36 of the direct FLOPs at x2, 36/144 at x4. A 2-tap
   axis is padded by 1 on both sides, so phase 0 (rows i-1, i) and phase s-1 (rows i, i+1)
   are the same convolution read one pixel apart: x2 is a single convolution (65x65 outputs,
   3% spare), x4 four, every one with 4·384 = 1536 outputs, large enough for cuDNN's
   implicit-GEMM tiles (16 per-phase convolutions would have 384).
4. A learned shortcut is ``conv_s(SPADE_s(x))`` with ``conv_s`` a 1x1 convolution, which is
   linear: ``conv_s(n·(1+gamma) + beta) = conv_s(n·(1+gamma)) + (conv_s∘beta)(hidden)``, and
   ``conv_s∘beta`` is one 3x3 convolution with ``conv_s``'s outputs (``ComposedShortcut``,
   its weight composed once in float64). It is done only where ``conv_s`` narrows, so that
   beta's convolution shrinks: up_0 (512 to 256 at 128x128) and up_1 (256 to 64 at 256x256),
   the only learned shortcuts, 38.65 of the fused decoder's 789.5 GFLOP per frame. It reads the
   SPADE's hidden map, which is already at the block's resolution (the ReLU'd output of rewrite
   1, no longer a nearest upsampling), so like gamma it is a plain 3x3 convolution: the phase
   decomposition applies only to ``mlp_shared`` over the segmap, which this rewrite leaves as is.

Only the PyTorch backend on CUDA swaps these in; checkpoints, the CPU path and the ONNX export
keep the plain modules. The SPADE's ``1 + gamma`` stays in the forward rather than in gamma's
bias: under torch.compile the add is free inside the modulation's pointwise kernel, and an fp16
gamma near 1 rounds coarser than one near 0 (CPU, fp16 vs fp32 at 32x32: RMS error 3.75e-4
folded, 3.63e-4 kept, 3.64e-4 plain).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def phase_taps(scale: int, phase: int) -> tuple[torch.Tensor, int]:
    """For output phase ``phase`` of a x``scale`` nearest upsampling: the (taps, 3) 0/1 matrix summing a 3-tap kernel's
    taps by the source row they land on, and the first source row's offset (-1, 0 or 1) from the phase's pixel."""
    offsets = [(phase + d) // scale for d in (-1, 0, 1)]
    rows = sorted(set(offsets))
    taps = torch.tensor([[1.0 if o == r else 0.0 for o in offsets] for r in rows], dtype=torch.float64)
    return taps, rows[0]


def _padding(taps: int) -> int:
    """A k-tap axis is padded by 1 for k >= 2 (output p then starts at source row p - 1), not at all for k = 1."""
    return 1 if taps >= 2 else 0


class UpsampledConv(nn.Module):
    """``conv3x3(nearest_upsample(x, scale))`` (padding 1) computed per output phase at the source resolution."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, scale: int) -> None:
        super().__init__()
        if weight.shape[-2:] != (3, 3) or scale < 1:
            raise ValueError(f"expected a 3x3 kernel and a scale >= 1, got {tuple(weight.shape)} and {scale}")
        self.scale = scale
        self.out_channels = weight.shape[0]
        source = weight.detach().double()
        axis = [(taps.to(source.device), first) for taps, first in (phase_taps(scale, p) for p in range(scale))]
        kernels: dict[tuple[int, int], list[torch.Tensor]] = {}
        # Per phase, row-major in (a, b): its group, its slot in the group, and where it starts in the group's output.
        self.phases: list[tuple[int, int, int, int]] = []
        for taps_a, first_a in axis:
            for taps_b, first_b in axis:
                size = (taps_a.shape[0], taps_b.shape[0])
                group = kernels.setdefault(size, [])
                start_a, start_b = first_a + _padding(size[0]), first_b + _padding(size[1])
                self.phases.append((list(kernels).index(size), len(group), start_a, start_b))
                group.append(torch.einsum("ty,ocyx,ux->octu", taps_a, source, taps_b))
        self.paddings = [(_padding(kh), _padding(kw)) for kh, kw in kernels]
        for index, group in enumerate(kernels.values()):
            stacked = torch.cat(group).to(weight.dtype).contiguous(memory_format=torch.channels_last)
            self.register_buffer(f"weight_{index}", stacked, persistent=False)
            self.register_buffer(f"bias_{index}", bias.detach().repeat(len(group)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        outputs = [
            F.conv2d(x, getattr(self, f"weight_{i}"), getattr(self, f"bias_{i}"), padding=padding)
            for i, padding in enumerate(self.paddings)
        ]
        o = self.out_channels
        phases = [outputs[g][:, n * o : (n + 1) * o, a : a + height, b : b + width] for g, n, a, b in self.phases]
        # pixel_shuffle reads channel c·s² + a·s + b as channel c at offset (a, b).
        return F.pixel_shuffle(torch.stack(phases, dim=2).flatten(1, 2), self.scale)


class SharedHidden(nn.Module):
    """The ``mlp_shared`` convolutions of every SPADE, one ReLU'd hidden map per resolution (SPADEs stacked)."""

    def __init__(self, spades_per_scale: Sequence[tuple[int, Sequence[nn.Module]]]) -> None:
        super().__init__()
        convs = []
        for scale, spades in spades_per_scale:
            shared = [spade.mlp_shared[0] for spade in spades]
            weight = torch.cat([conv.weight.detach() for conv in shared])
            bias = torch.cat([conv.bias.detach() for conv in shared])
            convs.append(UpsampledConv(weight, bias, scale))
        self.convs = nn.ModuleList(convs)

    def forward(self, feature: torch.Tensor) -> list[torch.Tensor]:
        return [F.relu(conv(feature)) for conv in self.convs]


class FusedModulation(nn.Module):
    """A SPADE reading its channels of a merged hidden map, with gamma and beta from one convolution."""

    def __init__(self, spade: nn.Module, offset: int) -> None:
        super().__init__()
        gamma, beta = spade.mlp_gamma, spade.mlp_beta
        self.offset = offset
        self.hidden = gamma.in_channels
        weight = torch.cat([gamma.weight.detach(), beta.weight.detach()]).contiguous(memory_format=torch.channels_last)
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", torch.cat([gamma.bias.detach(), beta.bias.detach()]), persistent=False)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        normalized = F.instance_norm(x, eps=1e-5)
        own = hidden[:, self.offset : self.offset + self.hidden]
        gamma, beta = F.conv2d(own, self.weight, self.bias, padding=1).chunk(2, dim=1)
        return normalized * (1 + gamma) + beta


class ComposedShortcut(nn.Module):
    """A learned shortcut ``conv_s(SPADE(x))``, the 1x1 ``conv_s`` composed into beta's convolution (rewrite 4)."""

    def __init__(self, modulation: FusedModulation, conv_s: nn.Conv2d) -> None:
        super().__init__()
        if conv_s.kernel_size != (1, 1) or conv_s.bias is not None or 2 * conv_s.in_channels != len(modulation.bias):
            raise ValueError(f"expected a 1x1 convolution without bias of the SPADE's channels, got {conv_s}")
        self.offset, self.hidden = modulation.offset, modulation.hidden
        self.channels, self.out_channels = conv_s.in_channels, conv_s.out_channels
        gamma_weight, beta_weight = modulation.weight.split(self.channels)
        gamma_bias, beta_bias = modulation.bias.split(self.channels)
        mix = conv_s.weight.detach()[:, :, 0, 0].double()
        beta_weight = torch.einsum("oc,cihw->oihw", mix, beta_weight.double()).to(gamma_weight.dtype)
        beta_bias = mix @ beta_bias.double()
        weight = torch.cat([gamma_weight, beta_weight]).contiguous(memory_format=torch.channels_last)
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", torch.cat([gamma_bias, beta_bias.to(gamma_bias.dtype)]), persistent=False)
        shortcut = conv_s.weight.detach().contiguous(memory_format=torch.channels_last)
        self.register_buffer("shortcut_weight", shortcut, persistent=False)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        normalized = F.instance_norm(x, eps=1e-5)
        own = hidden[:, self.offset : self.offset + self.hidden]
        modulation = F.conv2d(own, self.weight, self.bias, padding=1)
        gamma, beta = modulation.split([self.channels, self.out_channels], dim=1)
        return F.conv2d(normalized * (1 + gamma), self.shortcut_weight) + beta

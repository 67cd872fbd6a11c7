"""SPADE decoder (LivePortrait's generator G): the warped feature (B,256,64,64) to RGB (B,3,512,512).

The state dict equals the official ``decoder.pth`` (182 keys). Its spectrally normalised
convolutions are stored the way ``torch.nn.utils.spectral_norm`` saves them (``weight_orig``,
``weight_u``, ``weight_v``); ``finalize`` folds each into a plain convolution once, so no
sigma computation runs per frame or appears in an exported graph. On CUDA the PyTorch backend
then computes the SPADEs in merged convolutions (``use_fused_spade``) and composes each narrowing
shortcut's 1x1 convolution into its SPADE's beta (``use_composed_shortcuts``; see ``spade_fused``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.networks.spade_fused import ComposedShortcut, FusedModulation, SharedHidden
from engine.networks.uninitialized import without_random_init

FEATURE_CHANNELS = 256
MIDDLE_CHANNELS = 512
OUT_CHANNELS = 64
SPADE_HIDDEN = 128
MIDDLE_BLOCKS = 6
LEAKY_SLOPE = 0.2

_POWER_ITERATIONS = 30
_SPADE_MODULATION_GAIN = 0.2
_IMAGE_GAIN = 1.5


def spectral_normalized_weight(weight_orig: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Eval-mode spectral norm, as torch computes it: ``weight_orig / (u . (W_mat v))``, W_mat = weight as (out, -1)."""
    weight_mat = weight_orig.reshape(weight_orig.shape[0], -1)
    sigma = torch.dot(u, torch.mv(weight_mat, v))
    return weight_orig / sigma


class SpectralNormConv2d(nn.Module):
    """A convolution held in ``spectral_norm``'s saved layout until ``fold`` turns it into a plain ``nn.Conv2d``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, bias: bool = True) -> None:
        super().__init__()
        self.padding = kernel_size // 2
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)
        self.weight_orig = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.register_buffer("weight_u", torch.empty(out_channels))
        self.register_buffer("weight_v", torch.empty(in_channels * kernel_size * kernel_size))

    def weight(self) -> torch.Tensor:
        """The effective convolution weight, recomputed from the stored tensors."""
        return spectral_normalized_weight(self.weight_orig, self.weight_u, self.weight_v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight(), self.bias, padding=self.padding)

    @torch.no_grad()
    def fold(self) -> nn.Conv2d:
        """A plain convolution computing the same function, with the normalised weight baked in."""
        out_channels, in_channels, kernel_size, _ = self.weight_orig.shape
        with (
            without_random_init()
        ):  # every tensor is set below (torch's skip_init builds on the meta device: 0.7 s of imports)
            conv = nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                padding=self.padding,
                bias=self.bias is not None,
                device=self.weight_orig.device,
                dtype=self.weight_orig.dtype,
            )
        conv.weight = nn.Parameter(self.weight(), requires_grad=self.weight_orig.requires_grad)
        if self.bias is not None:
            conv.bias = self.bias
        return conv


def fold_spectral_norm(root: nn.Module) -> int:
    """Replace every ``SpectralNormConv2d`` under ``root`` by its folded ``nn.Conv2d``; return how many."""
    folded = 0
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, SpectralNormConv2d):
                setattr(parent, name, child.fold())
                folded += 1
    return folded


class SPADE(nn.Module):
    """Spatially adaptive normalisation: instance-normalise x, then scale and shift it by maps from the segmap."""

    def __init__(self, norm_channels: int, label_channels: int = FEATURE_CHANNELS) -> None:
        super().__init__()
        self.mlp_shared = nn.Sequential(nn.Conv2d(label_channels, SPADE_HIDDEN, 3, padding=1), nn.ReLU())
        self.mlp_gamma = nn.Conv2d(SPADE_HIDDEN, norm_channels, 3, padding=1)
        self.mlp_beta = nn.Conv2d(SPADE_HIDDEN, norm_channels, 3, padding=1)

    def forward(self, x: torch.Tensor, segmap: torch.Tensor) -> torch.Tensor:
        normalized = F.instance_norm(x, eps=1e-5)
        if segmap.shape[-2:] != x.shape[-2:]:
            segmap = F.interpolate(segmap, size=x.shape[-2:], mode="nearest")
        hidden = self.mlp_shared(segmap)
        return normalized * (1 + self.mlp_gamma(hidden)) + self.mlp_beta(hidden)


class SPADEResnetBlock(nn.Module):
    """Residual block of two SPADE-modulated 3x3 convolutions; a SPADE + 1x1 shortcut where the width changes."""

    def __init__(self, in_channels: int, out_channels: int, label_channels: int = FEATURE_CHANNELS) -> None:
        super().__init__()
        middle = min(in_channels, out_channels)
        self.learned_shortcut = in_channels != out_channels
        self.conv_0 = SpectralNormConv2d(in_channels, middle, 3)
        self.conv_1 = SpectralNormConv2d(middle, out_channels, 3)
        if self.learned_shortcut:
            self.conv_s = SpectralNormConv2d(in_channels, out_channels, 1, bias=False)
        self.norm_0 = SPADE(in_channels, label_channels)
        self.norm_1 = SPADE(middle, label_channels)
        if self.learned_shortcut:
            self.norm_s = SPADE(in_channels, label_channels)
        self.composed_shortcut: ComposedShortcut | None = None

    def forward(self, x: torch.Tensor, segmap: torch.Tensor) -> torch.Tensor:
        shortcut = self.shortcut(x, segmap)
        dx = self.conv_0(F.leaky_relu(self.norm_0(x, segmap), LEAKY_SLOPE))
        dx = self.conv_1(F.leaky_relu(self.norm_1(dx, segmap), LEAKY_SLOPE))
        return shortcut + dx

    def shortcut(self, x: torch.Tensor, segmap: torch.Tensor) -> torch.Tensor:
        """x where the width stays, else ``conv_s(norm_s(x))``, one module once ``use_composed_shortcuts`` ran."""
        if self.composed_shortcut is not None:
            return self.composed_shortcut(x, segmap)
        return self.conv_s(self.norm_s(x, segmap)) if self.learned_shortcut else x


class SPADEDecoder(nn.Module):
    """fc, six 512-wide SPADE blocks at 64x64, upsampling blocks at 128 and 256, a PixelShuffle head, sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Conv2d(FEATURE_CHANNELS, MIDDLE_CHANNELS, 3, padding=1)
        for index in range(MIDDLE_BLOCKS):
            self.add_module(f"G_middle_{index}", SPADEResnetBlock(MIDDLE_CHANNELS, MIDDLE_CHANNELS))
        self.up_0 = SPADEResnetBlock(MIDDLE_CHANNELS, FEATURE_CHANNELS)
        self.up_1 = SPADEResnetBlock(FEATURE_CHANNELS, OUT_CHANNELS)
        self.conv_img = nn.Sequential(nn.Conv2d(OUT_CHANNELS, 3 * 2 * 2, 3, padding=1), nn.PixelShuffle(2))
        self.shared_hidden: SharedHidden | None = None

    def middle_blocks(self) -> list[SPADEResnetBlock]:
        """The six full-width blocks, in order."""
        return [getattr(self, f"G_middle_{index}") for index in range(MIDDLE_BLOCKS)]

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        if feature.dim() != 4 or feature.shape[1] != FEATURE_CHANNELS:
            raise ValueError(
                f"decoder: expected a feature of shape (B,{FEATURE_CHANNELS},64,64) from the warp network, "
                f"got {tuple(feature.shape)}"
            )
        x = self.fc(feature)
        middle, up_0, up_1 = self.segmaps(feature)
        for block in self.middle_blocks():
            x = block(x, middle)
        x = self.up_0(F.interpolate(x, scale_factor=2, mode="nearest"), up_0)
        x = self.up_1(F.interpolate(x, scale_factor=2, mode="nearest"), up_1)
        return torch.sigmoid(self.conv_img(F.leaky_relu(x, LEAKY_SLOPE)))

    def segmaps(self, feature: torch.Tensor) -> list[torch.Tensor]:
        """What the SPADEs at 64, 128 and 256 read: the feature resized once per resolution, or once fused, their hidden
        maps."""
        if self.shared_hidden is not None:
            return self.shared_hidden(feature)
        return [feature, *(F.interpolate(feature, scale_factor=s, mode="nearest") for s in (2, 4))]

    def use_fused_spade(self) -> None:
        """Compute the SPADEs in merged convolutions, the same function (faster on CUDA; see spade_fused)."""
        if self.shared_hidden is not None:
            raise RuntimeError("the decoder's SPADEs are already fused")
        names = ("norm_0", "norm_1", "norm_s")
        slots = [
            (1, [(block, name) for block in self.middle_blocks() for name in names[:2]]),
            (2, [(self.up_0, name) for name in names]),
            (4, [(self.up_1, name) for name in names]),
        ]
        self.shared_hidden = SharedHidden([(scale, [getattr(b, n) for b, n in group]) for scale, group in slots])
        for _, group in slots:
            for index, (block, name) in enumerate(group):
                setattr(block, name, FusedModulation(getattr(block, name), index * SPADE_HIDDEN))

    def use_composed_shortcuts(self) -> list[str]:
        """Compose each learned shortcut's 1x1 ``conv_s`` into its fused SPADE's beta where that narrows beta's
        convolution (fewer FLOPs, the same function; see spade_fused); return the names of the blocks cut."""
        if self.shared_hidden is None:
            raise RuntimeError("compose the shortcuts after use_fused_spade: they compose into its beta convolutions")
        blocks = {name: b for name, b in self.named_children() if isinstance(b, SPADEResnetBlock)}
        if any(block.composed_shortcut is not None for block in blocks.values()):
            raise RuntimeError("the decoder's shortcuts are already composed")
        cut = [n for n, b in blocks.items() if b.learned_shortcut and b.conv_s.out_channels < b.conv_s.in_channels]
        for name in cut:
            block = blocks[name]
            block.composed_shortcut = ComposedShortcut(block.norm_s, block.conv_s)
            del block.norm_s, block.conv_s
        return cut


def build(state_dict: dict[str, torch.Tensor] | None = None) -> SPADEDecoder:
    """The decoder in the published shape (there is only one); a file of another shape fails in strict loading."""
    return SPADEDecoder()


def finalize(module: nn.Module, fold_batchnorm: bool = False) -> None:
    """Fold every spectral norm into its convolution (the decoder has no BatchNorm to fold)."""
    fold_spectral_norm(module)


@torch.no_grad()
def _randomize_conv(
    weight: torch.Tensor, bias: torch.Tensor | None, gain: float, bias_std: float, generator: torch.Generator
) -> None:
    fan_in = weight[0].numel()
    weight.copy_(torch.randn(weight.shape, generator=generator) * (gain / math.sqrt(fan_in)))
    if bias is not None:
        bias.copy_(torch.randn(bias.shape, generator=generator) * bias_std)


@torch.no_grad()
def _randomize_spectral(conv: SpectralNormConv2d, generator: torch.Generator) -> None:
    """Random weight_orig, and u, v from power iteration so that sigma approximates its largest singular value."""
    _randomize_conv(conv.weight_orig, conv.bias, math.sqrt(2.0), 0.02, generator)
    weight_mat = conv.weight_orig.reshape(conv.weight_orig.shape[0], -1)
    v = F.normalize(torch.randn(weight_mat.shape[1], generator=generator), dim=0)
    for _ in range(_POWER_ITERATIONS):
        u = F.normalize(torch.mv(weight_mat, v), dim=0)
        v = F.normalize(torch.mv(weight_mat.t(), u), dim=0)
    conv.weight_v.copy_(v)
    conv.weight_u.copy_(F.normalize(torch.mv(weight_mat, v), dim=0))


@torch.no_grad()
def _randomize_spade(spade: SPADE, generator: torch.Generator) -> None:
    shared = spade.mlp_shared[0]
    _randomize_conv(shared.weight, shared.bias, math.sqrt(2.0), 0.05, generator)
    for conv in (spade.mlp_gamma, spade.mlp_beta):
        _randomize_conv(conv.weight, conv.bias, _SPADE_MODULATION_GAIN, 0.05, generator)


def randomize(module: SPADEDecoder, generator: torch.Generator) -> None:
    """Deterministic stand-in weights: unit-gain convolutions, mild SPADE modulation, a head giving a spread sigmoid."""
    _randomize_conv(module.fc.weight, module.fc.bias, 1.0, 0.02, generator)
    for block in [*module.middle_blocks(), module.up_0, module.up_1]:
        shortcut = block.learned_shortcut
        for conv in [block.conv_0, block.conv_1, *([block.conv_s] if shortcut else [])]:
            _randomize_spectral(conv, generator)
        for spade in [block.norm_0, block.norm_1, *([block.norm_s] if shortcut else [])]:
            _randomize_spade(spade, generator)
    head = module.conv_img[0]
    _randomize_conv(head.weight, head.bias, _IMAGE_GAIN, 0.1, generator)

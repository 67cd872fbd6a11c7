"""Ditto's motion extractor (LivePortrait M): a ConvNeXtV2-tiny that reads pose, expression and keypoints.

The module tree reproduces the official ``motion_extractor.pth`` (212 keys, all under
``detector.``). Normalisation statistics (channels-first LayerNorm, GRN) are computed in
float32 whatever the input dtype, as autocast does in the reference, so fp16 runs stay sane.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

PUBLISHED_DEPTHS: tuple[int, ...] = (3, 3, 9, 3)
PUBLISHED_DIMS: tuple[int, ...] = (96, 192, 384, 768)
PUBLISHED_NUM_KP = 21
PUBLISHED_NUM_BINS = 66
EPS = 1e-6

HEAD_NAMES: tuple[str, ...] = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")

MotionOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def layer_norm_channels_first(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = EPS
) -> torch.Tensor:
    """LayerNorm over dim 1 of (N,C,H,W): (x - mean) / sqrt(biased var + eps) * weight + bias."""
    x32 = x.float()
    mean = x32.mean(1, keepdim=True)
    var = (x32 - mean).pow(2).mean(1, keepdim=True)
    normed = ((x32 - mean) / torch.sqrt(var + eps)).to(x.dtype)
    return weight[:, None, None] * normed + bias[:, None, None]


def global_response_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """ConvNeXtV2 GRN on (N,H,W,C): Gx = L2 norm over H,W per channel; x + gamma * x * Gx / (mean_C Gx + eps) + beta."""
    gx = torch.linalg.vector_norm(x.float(), ord=2, dim=(1, 2), keepdim=True)
    nx = (gx / (gx.mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return gamma * (x * nx) + beta + x


class ChannelsFirstLayerNorm(nn.Module):
    """LayerNorm across the channels of an NCHW tensor (keys ``weight``, ``bias``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_channels_first(x, self.weight, self.bias)


class GRN(nn.Module):
    """Global response normalisation over NHWC activations (keys ``gamma``, ``beta`` of shape (1,1,1,C))."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, channels))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return global_response_norm(x, self.gamma, self.beta)


class ConvNeXtV2Block(nn.Module):
    """x + pwconv2(GRN(GELU(pwconv1(LN(dwconv7x7(x)))))) with the MLP in channels-last layout."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=EPS)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.grn = GRN(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.grn(F.gelu(self.pwconv1(self.norm(y)))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtV2Detector(nn.Module):
    """ConvNeXtV2 backbone (stem /4, then /2 per stage) with seven linear heads on the pooled feature."""

    def __init__(
        self,
        in_channels: int = 3,
        depths: tuple[int, ...] = PUBLISHED_DEPTHS,
        dims: tuple[int, ...] = PUBLISHED_DIMS,
        num_kp: int = PUBLISHED_NUM_KP,
        num_bins: int = PUBLISHED_NUM_BINS,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        stem = nn.Sequential(nn.Conv2d(in_channels, dims[0], kernel_size=4, stride=4), ChannelsFirstLayerNorm(dims[0]))
        self.downsample_layers = nn.ModuleList([stem])
        for cin, cout in zip(dims[:-1], dims[1:]):
            self.downsample_layers.append(
                nn.Sequential(ChannelsFirstLayerNorm(cin), nn.Conv2d(cin, cout, kernel_size=2, stride=2))
            )
        self.stages = nn.ModuleList(
            nn.Sequential(*(ConvNeXtV2Block(dim) for _ in range(depth))) for depth, dim in zip(depths, dims)
        )
        self.norm = nn.LayerNorm(dims[-1], eps=EPS)
        width = dims[-1]
        self.fc_kp = nn.Linear(width, 3 * num_kp)
        self.fc_scale = nn.Linear(width, 1)
        self.fc_pitch = nn.Linear(width, num_bins)
        self.fc_yaw = nn.Linear(width, num_bins)
        self.fc_roll = nn.Linear(width, num_bins)
        self.fc_t = nn.Linear(width, 3)
        self.fc_exp = nn.Linear(width, 3 * num_kp)

    def forward(self, image: torch.Tensor) -> MotionOutputs:
        x = image
        for downsample, stage in zip(self.downsample_layers, self.stages):
            x = stage(downsample(x))
        feature = self.norm(x.mean(dim=(-2, -1)))
        return tuple(getattr(self, f"fc_{name}")(feature) for name in HEAD_NAMES)  # type: ignore[return-value]


class MotionExtractor(nn.Module):
    """RGB image (B,3,256,256) in [0,1] -> (pitch, yaw, roll logits (B,66), t (B,3), exp (B,63), scale (B,1), kp
    (B,63))."""

    def __init__(self, detector: ConvNeXtV2Detector | None = None) -> None:
        super().__init__()
        self.detector = detector if detector is not None else ConvNeXtV2Detector()

    def forward(self, image: torch.Tensor) -> MotionOutputs:
        channels = self.detector.in_channels
        if image.dim() != 4 or image.shape[1] != channels or image.shape[2] % 32 or image.shape[3] % 32:
            raise ValueError(
                f"motion extractor expects an RGB batch (B,{channels},H,W) with H and W divisible by 32 "
                f"(the official size is 256x256), got {tuple(image.shape)}"
            )
        return self.detector(image)


def build(state_dict: Mapping[str, torch.Tensor] | None = None) -> MotionExtractor:
    """The extractor with the published shapes, or shaped after ``state_dict``'s tensors."""
    if state_dict is None:
        return MotionExtractor()
    depths, dims = [], []
    while f"detector.stages.{len(depths)}.0.dwconv.weight" in state_dict:
        stage = len(depths)
        dims.append(state_dict[f"detector.stages.{stage}.0.dwconv.weight"].shape[0])
        depth = 0
        while f"detector.stages.{stage}.{depth}.dwconv.weight" in state_dict:
            depth += 1
        depths.append(depth)
    if not depths:
        raise KeyError("detector.stages.0.0.dwconv.weight")
    kp_rows = state_dict["detector.fc_kp.weight"].shape[0]
    if kp_rows % 3:
        raise ValueError(f"detector.fc_kp has {kp_rows} outputs, not 3 per keypoint")
    detector = ConvNeXtV2Detector(
        in_channels=state_dict["detector.downsample_layers.0.0.weight"].shape[1],
        depths=tuple(depths),
        dims=tuple(dims),
        num_kp=kp_rows // 3,
        num_bins=state_dict["detector.fc_pitch.weight"].shape[0],
    )
    return MotionExtractor(detector)


# Per head: (weight std, bias mean) on the unit-variance pooled feature, giving trained-looking ranges:
# spread pose logits, keypoints mostly inside [-1, 1], small expression and translation, scale near 1.
_HEAD_INIT: dict[str, tuple[float, float]] = {
    "pitch": (0.03, 0.0),
    "yaw": (0.03, 0.0),
    "roll": (0.03, 0.0),
    "t": (0.003, 0.0),
    "exp": (0.001, 0.0),
    "scale": (0.003, 1.0),
    "kp": (0.012, 0.0),
}


@torch.no_grad()
def randomize(module: MotionExtractor, generator: torch.Generator) -> None:
    """ConvNeXt-style weights (std 0.02), non-trivial norms and GRN, heads scaled to trained-looking ranges."""

    def normal(shape: torch.Size, std: float, mean: float = 0.0) -> torch.Tensor:
        return mean + std * torch.randn(shape, generator=generator)

    detector = module.detector
    for name, sub in detector.named_modules():
        head = name[3:] if name.startswith("fc_") else None
        if head is not None:
            std, bias = _HEAD_INIT[head]
            sub.weight.copy_(normal(sub.weight.shape, std))
            sub.bias.copy_(normal(sub.bias.shape, 0.1 * std, bias))
        elif isinstance(sub, (nn.Conv2d, nn.Linear)):
            sub.weight.copy_(normal(sub.weight.shape, 0.02))
            sub.bias.copy_(normal(sub.bias.shape, 0.02))
        elif isinstance(sub, (nn.LayerNorm, ChannelsFirstLayerNorm)):
            sub.weight.copy_(normal(sub.weight.shape, 0.1, 1.0))
            sub.bias.copy_(normal(sub.bias.shape, 0.05))
        elif isinstance(sub, GRN):
            sub.gamma.copy_(normal(sub.gamma.shape, 0.3))
            sub.beta.copy_(normal(sub.beta.shape, 0.05))


def finalize(module: MotionExtractor, fold_batchnorm: bool) -> None:
    """Nothing to fold: the network has LayerNorms and GRNs only, no BatchNorm."""

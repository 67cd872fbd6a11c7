"""Stitching MLP (LivePortrait S): a small correction of the driving keypoints given the source keypoints.

State dict keys ``mlp.{0,2,4,6}.{weight,bias}``; the official file wraps them under
``retarget_shoulder`` with a ``module.`` prefix, which ``engine.networks.checkpoints`` undoes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

NUM_KEYPOINTS = 21
HIDDEN_SIZES = (128, 128, 64)
DELTA_SIZE = 3 * NUM_KEYPOINTS + 2

_DELTA_GAIN = 0.03


class StitchingNetwork(nn.Module):
    """delta = mlp([kp_source, kp_driving]); kp_driving plus a per-keypoint delta plus one global (tx, ty)."""

    def __init__(self) -> None:
        super().__init__()
        sizes = (2 * 3 * NUM_KEYPOINTS, *HIDDEN_SIZES)
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], DELTA_SIZE))
        self.mlp = nn.Sequential(*layers)

    def forward(self, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        for name, kp in (("kp_source", kp_source), ("kp_driving", kp_driving)):
            if kp.dim() != 3 or tuple(kp.shape[1:]) != (NUM_KEYPOINTS, 3):
                raise ValueError(f"stitch_network: {name} must have shape (B,{NUM_KEYPOINTS},3), got {tuple(kp.shape)}")
        if kp_source.shape[0] != kp_driving.shape[0]:
            raise ValueError(
                "stitch_network: kp_source and kp_driving batch sizes differ "
                f"({kp_source.shape[0]} vs {kp_driving.shape[0]})"
            )
        batch = kp_driving.shape[0]
        delta = self.mlp(torch.cat([kp_source.reshape(batch, -1), kp_driving.reshape(batch, -1)], dim=1))
        per_keypoint = delta[:, : 3 * NUM_KEYPOINTS].reshape(batch, NUM_KEYPOINTS, 3)
        translation = F.pad(delta[:, 3 * NUM_KEYPOINTS :], (0, 1)).unsqueeze(1)
        return kp_driving + per_keypoint + translation


def build(state_dict: dict[str, torch.Tensor] | None = None) -> StitchingNetwork:
    """The stitching MLP in the published shape (there is only one); another shape fails in strict loading."""
    return StitchingNetwork()


def finalize(module: nn.Module, fold_batchnorm: bool = False) -> None:
    """Nothing to fold: the MLP has no normalisation layers."""


@torch.no_grad()
def randomize(module: StitchingNetwork, generator: torch.Generator) -> None:
    """He-scaled hidden layers and a small last layer, so the correction is a few percent of the keypoints."""
    linears = [layer for layer in module.mlp if isinstance(layer, nn.Linear)]
    for index, linear in enumerate(linears):
        gain = _DELTA_GAIN if index == len(linears) - 1 else math.sqrt(2.0)
        scale = gain / math.sqrt(linear.in_features)
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * scale)
        linear.bias.copy_(torch.randn(linear.bias.shape, generator=generator) * 0.01)

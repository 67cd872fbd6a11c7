"""Constant folding helpers shared by the networks (eval-mode BatchNorm into the preceding conv)."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def fold_batchnorm_into_conv(conv: nn.Conv2d | nn.Conv3d, bn: nn.BatchNorm2d | nn.BatchNorm3d) -> None:
    """Rewrite ``conv`` in place so that ``conv(x)`` equals ``bn(conv(x))`` in eval mode."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    shape = (-1,) + (1,) * (conv.weight.dim() - 1)
    conv.weight.mul_(scale.reshape(shape))
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    new_bias = (bias - bn.running_mean) * scale + bn.bias
    conv.bias = nn.Parameter(new_bias)


@torch.no_grad()
def randomize_batchnorm(bn: nn.modules.batchnorm._BatchNorm, generator: torch.Generator) -> None:
    """Plausible eval-mode statistics: weight near 1, small bias, running stats of a trained net."""
    n = bn.num_features
    bn.weight.copy_(1.0 + 0.1 * torch.randn(n, generator=generator))
    bn.bias.copy_(0.1 * torch.randn(n, generator=generator))
    bn.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
    bn.running_var.copy_(1.0 + 0.2 * torch.rand(n, generator=generator))

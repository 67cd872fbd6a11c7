"""Building blocks of the LMDM motion denoiser, in the parameter layout of the official checkpoint.

Rotary position embedding on the 512-d layer input, multi-head attention with
``nn.MultiheadAttention``'s packed in-projection, FiLM modulation, and the pre-norm encoder
and FiLM decoder layers built from them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ROTARY_THETA = 10000.0


def sinusoidal_embedding(times: torch.Tensor, dim: int) -> torch.Tensor:
    """Float32 diffusion-timestep embedding ``cat(sin(t·w), cos(t·w))``, w_i = 10000^(-i/(dim/2 - 1))."""
    half = dim // 2
    rates = torch.exp(torch.arange(half, device=times.device, dtype=torch.float32) * (-math.log(10000.0) / (half - 1)))
    angles = times.to(torch.float32)[:, None] * rates[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """Map every interleaved feature pair (a, b) to (-b, a): a quarter turn of each pair."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def attention_dtype(like: torch.Tensor) -> torch.dtype:
    """fp16 for float32 tensors on CUDA, else their own dtype.

    Flash attention in fp16 (fp32 accumulation) keeps the 10-bit mantissa of the TF32 matmuls
    around it; flash attention has no fp32 kernel, and SDPA's fp32 paths run several times slower.
    """
    return torch.float16 if like.is_cuda and like.dtype == torch.float32 else like.dtype


def film(h: torch.Tensor, scale_shift: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Feature-wise affine modulation ``(scale + 1)·h + shift``."""
    scale, shift = scale_shift
    return (scale + 1) * h + shift


class SinusoidalTimeEmbedding(nn.Module):
    """Timestep embedding computed in float32 (t up to 999 needs it), returned in the module's dtype."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        # An empty buffer that follows the module's dtype under .to()/.half().
        self.register_buffer("dtype_probe", torch.empty(0), persistent=False)

    def forward(self, times: torch.Tensor) -> torch.Tensor:
        return sinusoidal_embedding(times, self.dim).to(self.dtype_probe.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over the full feature width, positions 0..L-1 along dim -2.

    Feature pair (2i, 2i+1) at position p is rotated by the angle p·freqs[i]. ``freqs`` is the
    checkpoint's buffer; ``refresh`` rebuilds the cos/sin tables from it after loading.
    """

    def __init__(self, dim: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        freqs = 1.0 / (ROTARY_THETA ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("freqs", freqs)
        self.register_buffer("cos", torch.empty(max_positions, dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, dim), persistent=False)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute the cos/sin tables (float32 angles) from ``freqs``."""
        positions = torch.arange(self.max_positions, dtype=torch.float32, device=self.freqs.device)
        angles = torch.outer(positions, self.freqs.float()).repeat_interleave(2, dim=-1)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate the rows of ``x`` as positions offset..offset+L-1."""
        end = offset + x.shape[-2]
        if end > self.max_positions:
            raise ValueError(f"rotary embedding covers {self.max_positions} positions, got positions up to {end}")
        return x * self.cos[offset:end] + rotate_pairs(x) * self.sin[offset:end]


class RotaryAttention(nn.Module):
    """Multi-head attention with ``nn.MultiheadAttention``'s keys; q/k come from rotated inputs, v from plain ones.

    ``in_proj_weight`` rows [0:d], [d:2d], [2d:3d] project queries, keys and values.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * dim))
        self.out_proj = nn.Linear(dim, dim)

    def attend_self(self, rotated: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
        """Self-attention: queries and keys from ``rotated``, values from ``plain``."""
        d = plain.shape[-1]
        q, k = F.linear(rotated, self.in_proj_weight[: 2 * d], self.in_proj_bias[: 2 * d]).chunk(2, dim=-1)
        v = F.linear(plain, self.in_proj_weight[2 * d :], self.in_proj_bias[2 * d :])
        return self._attend(q, k, v)

    def project_memory(self, rotated_memory: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys (from ``rotated_memory``) and values (from ``memory``); row-wise, so rows can be
        projected apart."""
        d = memory.shape[-1]
        k = F.linear(rotated_memory, self.in_proj_weight[d : 2 * d], self.in_proj_bias[d : 2 * d])
        v = F.linear(memory, self.in_proj_weight[2 * d :], self.in_proj_bias[2 * d :])
        return k, v

    def attend_cross(self, rotated_query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Cross-attention of queries from ``rotated_query`` over projected memory keys and values."""
        d = rotated_query.shape[-1]
        q = F.linear(rotated_query, self.in_proj_weight[:d], self.in_proj_bias[:d])
        return self._attend(q, keys, values)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        dtype = attention_dtype(q)
        heads = [t.unflatten(-1, (self.heads, -1)).transpose(1, 2).to(dtype) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*heads).to(q.dtype)
        return self.out_proj(out.transpose(1, 2).flatten(-2))


class DenseFiLM(nn.Module):
    """FiLM generator: Mish then Linear(d -> 2d) of t, the (scale, shift) halves; called as ``block`` (checkpoint
    keys)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Mish(), nn.Linear(dim, 2 * dim))


class EncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer: rotary self-attention, then GELU feed-forward."""

    def __init__(self, dim: int, heads: int, ff_dim: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = RotaryAttention(dim, heads)
        self.linear1 = nn.Linear(dim, ff_dim)
        self.linear2 = nn.Linear(ff_dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.rotary = rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn.attend_self(self.rotary(h), h)
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class FiLMDecoderLayer(nn.Module):
    """Pre-norm decoder layer; self-attention, cross-attention and feed-forward each FiLM-modulated by t."""

    def __init__(self, dim: int, heads: int, ff_dim: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = RotaryAttention(dim, heads)
        self.multihead_attn = RotaryAttention(dim, heads)
        self.linear1 = nn.Linear(dim, ff_dim)
        self.linear2 = nn.Linear(ff_dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.film1 = DenseFiLM(dim)
        self.film2 = DenseFiLM(dim)
        self.film3 = DenseFiLM(dim)
        self.rotary = rotary

    def modulation(self, t: torch.Tensor) -> torch.Tensor:
        """The three FiLM generators' outputs for time vectors t (...,d): (...,3,2d) of (scale, shift) pairs."""
        return torch.stack([generator.block(t) for generator in (self.film1, self.film2, self.film3)], dim=-2)

    def forward(
        self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, modulation: torch.Tensor
    ) -> torch.Tensor:
        """``keys``/``values``: the memory projected by this layer's cross-attention (``project_memory``);
        ``modulation`` (B,3,2d): this layer's ``modulation(t)``, computable before the step."""
        film1, film2, film3 = (m.unsqueeze(1).chunk(2, dim=-1) for m in modulation.unbind(-2))
        h = self.norm1(x)
        x = x + film(self.self_attn.attend_self(self.rotary(h), h), film1)
        h = self.norm2(x)
        x = x + film(self.multihead_attn.attend_cross(self.rotary(h), keys, values), film2)
        h = self.linear2(F.gelu(self.linear1(self.norm3(x))))
        return x + film(h, film3)


class DecoderStack(nn.Module):
    """The decoder layers under the checkpoint's ``seqTransDecoder.stack`` prefix."""

    def __init__(self, layers: list[FiLMDecoderLayer]) -> None:
        super().__init__()
        self.stack = nn.ModuleList(layers)

    def project_memory(
        self, rotated_memory: torch.Tensor, memory: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's cross-attention keys and values of the memory rows."""
        return [layer.multihead_attn.project_memory(rotated_memory, memory) for layer in self.stack]

    def modulation(self, t: torch.Tensor) -> torch.Tensor:
        """Every layer's FiLM parameters for time vectors t (...,d): (...,layers,3,2d)."""
        return torch.stack([layer.modulation(t) for layer in self.stack], dim=-3)

    def forward(
        self, x: torch.Tensor, memory_kv: list[tuple[torch.Tensor, torch.Tensor]], modulation: torch.Tensor
    ) -> torch.Tensor:
        """``modulation`` (B,layers,3,2d) from ``modulation(t)``."""
        for i, (layer, (keys, values)) in enumerate(zip(self.stack, memory_kv)):
            x = layer(x, keys, values, modulation[:, i])
        return x

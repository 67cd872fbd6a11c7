"""The LMDM's whole DDIM step in fewer, larger kernels: the same function as ``LMDM`` plus the update.

At batch 1 a DDIM step is a few hundred small kernels, and the GPU is bound by their number, not by
FLOPs. Exact reformulations that remove kernels:

* layer norm + rotary in one pass: rotating the interleaved pairs of LN(x) is LN of the
  pair-swapped x with pair-swapped γ/β (mean and variance do not depend on the order), so the
  rotated and the plain normalised rows come out of one reduction, no separate rotary kernel;
* every layer's cross-attention keys/values in one buffer, already split into heads and in the
  attention's dtype: the 80 condition rows are written once per window, the 2 time-token rows
  (the same for every window) by one copy per step instead of a concatenation and a cast per layer;
* FiLM's ``scale + 1`` tabulated per window with the modulation;
* the DDIM update (x0, ε̂ and the noise mixed by the step's coefficients) inside the step, so
  that a compiled step fuses it with the guidance instead of running it as separate kernels.

On CUDA the matrix products can run in fp16 (``matmul_dtype``) while the residual stream, the layer
norms, FiLM and the DDIM update stay fp32: fp16 operands carry the same 10-bit mantissa that TF32 rounds
fp32 operands to, so the products are no coarser, and cuBLAS runs fp16 at twice TF32's rate with half the
weight traffic, without split-K reduces. The casts ride in the neighbouring pointwise kernels. What is
left at one window is launch-bound (a product or a pointwise kernel costs about the same whatever its
size), so launches are merged where that is exact:

* the self-attention's q/k and v products as one product up to ``MERGED_PROJECTION_ROWS`` rows;
* ff1's GELU in the product's epilogue (``torch._addmm_activation``; on CUDA the tanh approximation);
* the input and final projections in fp16 too, their 530 inputs and 265 outputs zero-padded to multiples
  of 8 so that cuBLAS picks aligned tensor-core kernels (unaligned TF32 rows take several slow kernels).

The timings of each step are in bench/results/README.md (the LMDM rows).

``FusedLMDMStep`` shares the loaded module's parameters: its derived tables, and the fp16 copies of
the layers' weights when ``matmul_dtype`` asks for them, are built from them, so it is built after
loading. The checkpoint layout, the plain ``LMDM`` and the ONNX export are unchanged. The PyTorch
backend swaps it in after loading.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.diffusion.ddim import ddim_update
from engine.networks.lmdm import (
    GUIDANCE_WEIGHT,
    LMDM,
    NUM_HEADS,
    TIME_TOKENS,
)
from engine.networks.lmdm_blocks import FiLMDecoderLayer, attention_dtype
from engine.timebase import SEQ_FRAMES

MERGED_PROJECTION_ROWS = 640
"""Up to this many rows (4 guided windows of 80 frames) the self-attention's q/k and v products run as one: they are
launch-bound there, so one launch of twice the FLOPs beats two; from 8 windows on, two separate products are faster."""


class FusedWindow(NamedTuple):
    """A window's per-step constants for ``FusedLMDMStep.ddim_step`` (2B rows: conditional, then unconditional).

    ``cross_kv`` (layers,2,2B,heads,82,hd): every layer's cross-attention keys and values, rows
    80-81 rewritten by each step; ``time_kv`` (S,layers,2,1,heads,2,hd) those rows per step;
    ``modulation`` (S,2B,layers,3,2d) the FiLM (scale + 1, shift); ``step_of_time`` (1000,) t -> row.
    """

    cross_kv: torch.Tensor
    time_kv: torch.Tensor
    modulation: torch.Tensor
    step_of_time: torch.Tensor


def pair_swap(x: torch.Tensor) -> torch.Tensor:
    """Swap every interleaved feature pair (a, b) -> (b, a) along the last axis."""
    return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def norm_rotary(
    x: torch.Tensor,
    norm: nn.LayerNorm,
    swapped: tuple[torch.Tensor, torch.Tensor],
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotary(LN(x)), LN(x)) from one mean/variance of x; ``swapped`` is LN's (γ, β) pair-swapped."""
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + norm.eps)
    plain = (x - mean) * rstd * norm.weight + norm.bias
    partner = (pair_swap(x) - mean) * rstd * swapped[0] + swapped[1]
    return plain * cos + partner * signed_sin, plain


def norm_then_rotary(
    x: torch.Tensor,
    norm: nn.LayerNorm,
    swapped: tuple[torch.Tensor, torch.Tensor],
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``norm_rotary`` in the fewest eager operators: the layer norm, then the rotation of its output."""
    plain = norm(x)
    return plain * cos + pair_swap(plain) * signed_sin, plain


class FusedLayer(nn.Module):
    """One ``FiLMDecoderLayer`` over prepared cross-attention keys/values and tabulated FiLM parameters."""

    def __init__(
        self, layer: FiLMDecoderLayer, cos: torch.Tensor, signed_sin: torch.Tensor, matmul_dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("cos", cos.clone(), persistent=False)
        self.register_buffer("signed_sin", signed_sin.clone(), persistent=False)
        for name in ("norm1", "norm2"):
            norm = getattr(layer, name)
            swapped = torch.stack((pair_swap(norm.weight), pair_swap(norm.bias))).detach()
            self.register_buffer(f"{name}_swapped", swapped, persistent=False)
        attn, cross, d = layer.self_attn, layer.multihead_attn, cos.shape[-1]
        products = {
            "qkv": (attn.in_proj_weight, attn.in_proj_bias),
            "self_out": (attn.out_proj.weight, attn.out_proj.bias),
            "q": (cross.in_proj_weight[:d], cross.in_proj_bias[:d]),
            "cross_out": (cross.out_proj.weight, cross.out_proj.bias),
            "ff1": (layer.linear1.weight, layer.linear1.bias),
            "ff2": (layer.linear2.weight, layer.linear2.bias),
        }
        # Views of the module's parameters in their own dtype, fp16 copies otherwise.
        for name, (weight, bias) in products.items():
            self.register_buffer(f"{name}_weight", weight.detach().to(matmul_dtype), persistent=False)
            self.register_buffer(f"{name}_bias", bias.detach().to(matmul_dtype), persistent=False)

    def _linear(self, name: str, x: torch.Tensor, outputs: slice = slice(None)) -> torch.Tensor:
        """The layer's product ``name`` of x (only its ``outputs`` features), in the products' dtype."""
        weight = getattr(self, f"{name}_weight")
        return F.linear(x.to(weight.dtype), weight[outputs], getattr(self, f"{name}_bias")[outputs])

    def _linear_gelu(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """GELU of the layer's product ``name`` of x, applied in the product's epilogue instead of a kernel of its own.

        On the CPU this is the exact (erf) GELU; on CUDA cuBLASLt's epilogue computes its tanh approximation, at most
        4.7e-4 from the erf form: below the fp16 rounding of the product's output at |GELU| > 1.
        """
        weight = getattr(self, f"{name}_weight")
        rows = x.to(weight.dtype).flatten(0, -2)
        return torch._addmm_activation(getattr(self, f"{name}_bias"), rows, weight.t(), use_gelu=True).unflatten(
            0, x.shape[:-1]
        )

    def _self_projections(
        self, rotated: torch.Tensor, plain: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention q, k (of the rotated rows) and v (of the plain rows). Up to ``MERGED_PROJECTION_ROWS`` rows
        one product of both inputs stacked by all three weights, the unwanted half discarded; above it two products."""
        d = plain.shape[-1]
        if plain.shape[0] * plain.shape[1] > MERGED_PROJECTION_ROWS:
            q, k = self._linear("qkv", rotated, slice(2 * d)).chunk(2, dim=-1)
            return q, k, self._linear("qkv", plain, slice(2 * d, None))
        both = self._linear("qkv", torch.cat((rotated, plain)))
        q, k = both[: len(plain), :, : 2 * d].chunk(2, dim=-1)
        return q, k, both[len(plain) :, :, 2 * d :]

    def forward(
        self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, modulation: torch.Tensor
    ) -> torch.Tensor:
        """``keys``/``values`` (2B,heads,82,hd) in the attention dtype; ``modulation`` (2B,3,2d) of (scale + 1,
        shift)."""
        layer = self.layer
        heads = layer.self_attn.heads
        # One reduction per norm for the compiler; eagerly (the CPU path) fewer operators.
        norm_rotary_ = norm_rotary if torch.compiler.is_compiling() else norm_then_rotary
        (s1, b1), (s2, b2), (s3, b3) = (m.unsqueeze(1).chunk(2, dim=-1) for m in modulation.unbind(-2))
        rotated, plain = norm_rotary_(x, layer.norm1, self.norm1_swapped.unbind(0), self.cos, self.signed_sin)
        q, k, v = self._self_projections(rotated, plain)
        attended = _attend(heads, q, *(_heads(t, heads, keys.dtype) for t in (k, v)))
        x = x + (s1 * self._linear("self_out", attended) + b1)
        rotated, _ = norm_rotary_(x, layer.norm2, self.norm2_swapped.unbind(0), self.cos, self.signed_sin)
        attended = _attend(heads, self._linear("q", rotated), keys, values)
        x = x + (s2 * self._linear("cross_out", attended) + b2)
        h = self._linear("ff2", self._linear_gelu("ff1", layer.norm3(x)))
        return x + (s3 * h + b3)


class AlignedLinear(nn.Module):
    """``linear`` in ``dtype`` with its weight and bias zero-padded to multiples of 8 input and output features:
    cuBLAS's
    tensor-core kernels want 16-byte aligned rows, and the LMDM's 530 inputs and 265 outputs are not."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.outputs, inputs = linear.weight.shape
        self.input_pad = -inputs % 8
        weight = F.pad(linear.weight.detach(), (0, self.input_pad, 0, -self.outputs % 8))
        self.register_buffer("weight", weight.to(dtype), persistent=False)
        self.register_buffer("bias", F.pad(linear.bias.detach(), (0, -self.outputs % 8)).to(dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``linear(x)`` in the padded weights' dtype: x padded with zeros, the padded outputs dropped."""
        if self.input_pad:
            x = F.pad(x, (0, self.input_pad))
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)[..., : self.outputs]


def _heads(t: torch.Tensor, heads: int, dtype: torch.dtype) -> torch.Tensor:
    """(N,L,d) -> (N,heads,L,d/heads) in ``dtype``."""
    return t.unflatten(-1, (heads, -1)).transpose(1, 2).to(dtype)


def _attend(heads: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of (N,L,d) queries over head-split keys/values, heads joined again: (N,L,d) in k's dtype."""
    return F.scaled_dot_product_attention(_heads(q, heads, k.dtype), k, v).transpose(1, 2).flatten(-2)


class FusedLMDMStep(nn.Module):
    """``prepare_window(cond, times)`` once per window, then ``ddim_step`` per step: the LMDM's DDIM loop, fewer
    kernels."""

    def __init__(self, lmdm: LMDM, matmul_dtype: torch.dtype | None = None) -> None:
        """``matmul_dtype``: the decoder layers' products (None: the module's own dtype)."""
        super().__init__()
        self.lmdm = lmdm
        rotary = lmdm.rotary
        dtype = lmdm.final_layer.weight.dtype
        sign = torch.tensor([-1.0, 1.0], device=rotary.sin.device).repeat(rotary.sin.shape[-1] // 2)
        cos, signed_sin = rotary.cos[:SEQ_FRAMES].to(dtype), (rotary.sin[:SEQ_FRAMES] * sign).to(dtype)
        self.layers = nn.ModuleList(
            FusedLayer(layer, cos, signed_sin, matmul_dtype or dtype) for layer in lmdm.seqTransDecoder.stack
        )
        self.input_projection = AlignedLinear(lmdm.input_projection, matmul_dtype or dtype)
        self.final_layer = AlignedLinear(lmdm.final_layer, matmul_dtype or dtype)

    @torch.no_grad()
    def prepare_window(self, cond: torch.Tensor, times: torch.Tensor) -> FusedWindow:
        """``LMDM.prepare_window`` rearranged: keys/values per layer in one buffer of heads, scale + 1 tabulated."""
        window = self.lmdm.prepare_window(cond, times)
        dtype = attention_dtype(self.lmdm.final_layer.weight)
        condition = torch.stack([torch.stack(kv) for kv in window.memory_kv])
        rows = condition.shape[3]
        head_dim = condition.shape[-1] // NUM_HEADS
        cross_kv = torch.empty(
            *condition.shape[:3], NUM_HEADS, rows + TIME_TOKENS, head_dim, dtype=dtype, device=cond.device
        )
        cross_kv[..., :rows, :] = condition.unflatten(-1, (NUM_HEADS, -1)).transpose(-2, -3)
        time_kv = torch.stack([torch.stack(kv, dim=1) for kv in window.time_kv], dim=1)
        time_kv = time_kv.unflatten(-1, (NUM_HEADS, -1)).transpose(-2, -3).unsqueeze(3).to(dtype)
        scale, shift = window.modulation.chunk(2, dim=-1)
        return FusedWindow(cross_kv, time_kv, torch.cat((scale + 1, shift), dim=-1), window.step_of_time)

    def forward_prepared(
        self, x: torch.Tensor, cond_frame: torch.Tensor, window: FusedWindow, time_cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``LMDM.forward`` for a prepared window: (pred_noise, x_start) at ``time_cond`` (every row the same step)."""
        lmdm = self.lmdm
        dtype = lmdm.final_layer.weight.dtype
        step = window.step_of_time[time_cond[:1]]  # an index tensor, not a Python int: no host sync in the graph
        window.cross_kv[..., -TIME_TOKENS:, :] = window.time_kv[step].squeeze(0)
        h = self.input_projection(lmdm.input_rows(x, cond_frame)).to(dtype).repeat(2, 1, 1)
        modulation = window.modulation[step].squeeze(0)
        for i, layer in enumerate(self.layers):
            h = layer(h, window.cross_kv[i, 0], window.cross_kv[i, 1], modulation[:, i])
        return lmdm._with_noise(x, lmdm._guide(self.final_layer(h), GUIDANCE_WEIGHT), time_cond)

    def ddim_step(
        self,
        x: torch.Tensor,
        cond_frame: torch.Tensor,
        window: FusedWindow,
        time_cond: torch.Tensor,
        coefficients: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        """One DDIM step: coefficients (3,) mix (x0, ε̂, noise); (1, 0, 0) on the last step returns x0."""
        pred_noise, x_start = self.forward_prepared(x, cond_frame, window, time_cond)
        return ddim_update(x_start, pred_noise, noise, coefficients)

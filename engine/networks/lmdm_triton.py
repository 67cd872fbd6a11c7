"""One LMDM decoder layer in eight kernels on CUDA: its products with the norms, rotary, GELU and FiLM fused in.

At one window a DDIM step is ~150 kernels, most of them a few microseconds long, and the GPU
waits on their number (bench/results/2026-12-01_h200_lmdm_fp16_products.json). ``FusedLayer``
on Inductor is ~18 per layer: each product is a cuBLAS call, and the layer norms, the rotary,
GELU, the FiLM residuals and the head layouts around them are kernels of their own. Here every
product is one Triton kernel that does its neighbours' work on the way in or out:

* in: the layer norm of the fp32 residual rows (statistics in fp32, two passes), and for the
  columns that are queries or keys the rotary of the normalised row (its pair partner read
  from the swapped column), cast to fp16 for the tensor cores; or the attention output read in
  its (rows, heads, frames, head_dim) layout;
* out: queries/keys/values written split into heads, as attention reads them; exact GELU
  (erf) in fp16; or the FiLM residual ``x + (scale + 1)·(h + bias) + shift`` in fp32.

So a layer is three such products, two attentions and three more products. Operands are fp16
with fp32 accumulation, the residual stream fp32: the arithmetic of ``FusedLayer`` with fp16
products, reordered only inside a product's reduction. ``FusedLayer`` stays the reference and
the path everywhere else (the CPU, fp32 products); the tests run these kernels on the CPU in
Triton's interpreter against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

A_NORMED, A_HEADS, A_ROWS = 0, 1, 2
OUT_HEADS, OUT_GELU, OUT_FILM = 0, 1, 2


@triton.jit
def _product(
    a_ptr, w_ptr, bias_ptr, out_ptr,
    norm_w_ptr, norm_b_ptr, cos_ptr, sin_ptr,
    res_ptr, mod_ptr, mod_stride,
    M, N, FRAMES,
    K: tl.constexpr, ROTARY_N: tl.constexpr, A_MODE: tl.constexpr, OUT_MODE: tl.constexpr,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, EPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    frame = rows % FRAMES
    sequence = rows // FRAMES
    if A_MODE == 0:
        total = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            total += tl.sum(tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None], other=0.0), axis=1)
        mean = total / K
        spread = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None], other=0.0)
            centred = tl.where(row_ok[:, None], x - mean[:, None], 0.0)
            spread += tl.sum(centred * centred, axis=1)
        rstd = 1.0 / tl.sqrt(spread / K + EPS)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        if A_MODE == 0:
            x = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None], other=0.0)
            a = (x - mean[:, None]) * rstd[:, None] * tl.load(norm_w_ptr + ks)[None, :] + tl.load(norm_b_ptr + ks)[None, :]
            if pid_n * BLOCK_N < ROTARY_N:
                partner_ks = ks ^ 1
                xp = tl.load(a_ptr + rows[:, None] * K + partner_ks[None, :], mask=row_ok[:, None], other=0.0)
                partner = (xp - mean[:, None]) * rstd[:, None] * tl.load(norm_w_ptr + partner_ks)[None, :] + tl.load(norm_b_ptr + partner_ks)[None, :]
                table = frame[:, None] * K + ks[None, :]
                a = a * tl.load(cos_ptr + table) + partner * tl.load(sin_ptr + table)
            a = a.to(tl.float16)
        elif A_MODE == 1:
            head = ks // HEAD_DIM
            offset = (sequence[:, None] * HEADS + head[None, :]) * FRAMES * HEAD_DIM + frame[:, None] * HEAD_DIM + (ks % HEAD_DIM)[None, :]
            a = tl.load(a_ptr + offset, mask=row_ok[:, None], other=0.0)
        else:
            a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=col_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc)
    acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    ok = row_ok[:, None] & col_ok[None, :]
    if OUT_MODE == 0:
        width = HEADS * HEAD_DIM
        which = cols // width
        head = (cols % width) // HEAD_DIM
        offset = ((which[None, :] * (M // FRAMES) + sequence[:, None]) * HEADS + head[None, :]) * FRAMES * HEAD_DIM
        offset += frame[:, None] * HEAD_DIM + (cols % HEAD_DIM)[None, :]
        tl.store(out_ptr + offset, acc.to(tl.float16), mask=ok)
    elif OUT_MODE == 1:
        gelu = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], gelu.to(tl.float16), mask=ok)
    else:
        film = sequence[:, None] * mod_stride + cols[None, :]
        scale = tl.load(mod_ptr + film, mask=ok, other=0.0)
        shift = tl.load(mod_ptr + film + N, mask=ok, other=0.0)
        residual = tl.load(res_ptr + rows[:, None] * N + cols[None, :], mask=ok, other=0.0)
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], residual + scale * acc + shift, mask=ok)


def _blocks(rows: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps): small tiles when few rows, so a product still spreads over the SMs."""
    if rows <= 640:
        return 32, 64, 64, 4
    return 64, 128, 64, 8


def product(
    a: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    *,
    a_mode: int,
    out_mode: int,
    frames: int,
    heads: int,
    norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    rotary: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    residual: torch.Tensor | None = None,
    modulation: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out`` <- ``a`` (read as ``a_mode``) times ``weight``ᵀ (N x K, fp16) plus ``bias``, written as ``out_mode``.

    ``norm`` (γ, β, eps) normalises fp32 rows of K features; ``rotary`` (cos, signed sin, n) rotates them for the
    first n output columns; ``residual`` (rows x N, fp32) and ``modulation`` (sequences x 2N: scale + 1, then
    shift; rows beyond the first 2N ignored) make the FiLM residual. Heads are ``heads`` of K // heads (or
    N // heads per written tensor) features; sequences are ``frames`` rows long."""
    rows = a.shape[0] * a.shape[2] if a_mode == A_HEADS else a.shape[0]
    cols, depth = weight.shape
    block_m, block_n, block_k, warps = _blocks(rows)
    gamma, beta, eps = norm if norm is not None else (bias, bias, 0.0)
    cos, sin, rotary_cols = rotary if rotary is not None else (bias, bias, 0)
    residual = residual if residual is not None else out
    modulation = modulation if modulation is not None else bias.unsqueeze(0)
    head_dim = out.shape[-1] if out_mode == OUT_HEADS else depth // heads
    grid = (triton.cdiv(rows, block_m), triton.cdiv(cols, block_n))
    _product[grid](
        a, weight, bias, out, gamma, beta, cos, sin, residual, modulation, modulation.stride(0),
        rows, cols, frames,
        K=depth, ROTARY_N=rotary_cols, A_MODE=a_mode, OUT_MODE=out_mode, HEADS=heads, HEAD_DIM=head_dim,
        EPS=eps, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )
    return out


def decoder_layer(fused, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
    """``FusedLayer.forward`` (fp16 products, CUDA) in eight kernels: x (S,L,d) fp32 -> (S,L,d) fp32."""
    layer = fused.layer
    sequences, frames, d = x.shape
    heads = layer.self_attn.heads
    rows = x.reshape(-1, d)
    half = dict(dtype=torch.float16, device=x.device)
    shape = dict(frames=frames, heads=heads)

    def norm(module: torch.nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor, float]:
        return module.weight, module.bias, module.eps

    qkv = torch.empty(3, sequences, heads, frames, d // heads, **half)
    product(rows, fused.qkv_weight, fused.qkv_bias, qkv, a_mode=A_NORMED, out_mode=OUT_HEADS, **shape,
            norm=norm(layer.norm1), rotary=(fused.cos, fused.signed_sin, 2 * d))
    attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
    after_self = product(attended, fused.self_out_weight, fused.self_out_bias, torch.empty_like(rows), a_mode=A_HEADS,
                         out_mode=OUT_FILM, **shape, residual=rows, modulation=modulation[:, 0])
    q = torch.empty(1, sequences, heads, frames, d // heads, **half)
    product(after_self, fused.q_weight, fused.q_bias, q, a_mode=A_NORMED, out_mode=OUT_HEADS, **shape,
            norm=norm(layer.norm2), rotary=(fused.cos, fused.signed_sin, d))
    attended = F.scaled_dot_product_attention(q[0], keys, values)
    after_cross = product(attended, fused.cross_out_weight, fused.cross_out_bias, torch.empty_like(rows), a_mode=A_HEADS,
                          out_mode=OUT_FILM, **shape, residual=after_self, modulation=modulation[:, 1])
    hidden = torch.empty(rows.shape[0], fused.ff1_weight.shape[0], **half)
    product(after_cross, fused.ff1_weight, fused.ff1_bias, hidden, a_mode=A_NORMED, out_mode=OUT_GELU, **shape, norm=norm(layer.norm3))
    out = product(hidden, fused.ff2_weight, fused.ff2_bias, torch.empty_like(rows), a_mode=A_ROWS, out_mode=OUT_FILM, **shape,
                  residual=after_cross, modulation=modulation[:, 2])
    return out.view(sequences, frames, d)

"""The render's slow convolutions, one at a time, under each way of running them (issue 21's first step).

The decoder's 64-output convolutions at 256x256 (``up_1.conv_0``, ``up_1.conv_1``, the head ``conv_img``) run at
28-130 TFLOP/s under cuDNN's heuristic pick, against ~450 for the 512-channel ones at 64x64. Per shape, fp16,
channels-last, 16 frames, CUDA events: cuDNN's heuristic, cuDNN benchmarking its default 10 candidates, cuDNN
benchmarking every candidate, Inductor's Triton convolution template under max-autotune, and a Triton
implicit-GEMM kernel written for 3x3 / stride 1 / padding 1 (``triton_conv3x3``). Each result carries its relative
error against an fp32 convolution of the same inputs.

``--render`` then times the graphed, compiled warp+decode at 16 frames as the runtime captures it, as it is and
with those three layers computed by ``triton_conv3x3``, and gives the PSNR of one against the other.

``python -m bench.conv_kernels [--out FILE.json] [--variants ...] [--render]`` (CUDA; random inputs and weights).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.timing import gpu_time

FRAMES = 16
SHAPES = {
    "decoder.up_1.conv_0": (256, 64, 256),
    "decoder.up_1.conv_1": (64, 64, 256),
    "decoder.conv_img.0": (64, 12, 256),
    "decoder.up_1.norm_1 gamma+beta": (128, 128, 256),
    "decoder.G_middle.conv (reference)": (512, 512, 64),
}
"""Layer -> (in channels, out channels, side) of its 3x3 convolution."""
VARIANTS = ("cudnn", "cudnn benchmark", "cudnn benchmark all", "inductor triton template", "triton implicit gemm")


def triton_conv3x3(fixed: dict | None = None):
    """A 3x3, stride-1, padding-1 convolution of channels-last fp16 tensors as one Triton implicit GEMM:
    rows are output pixels, columns output channels, the reduction runs over (tap, input channel).
    Autotuned over tile sizes, or one ``fixed`` config (``BLOCK_M``, ``BLOCK_K``; how the CPU interpreter runs it)."""
    import triton
    import triton.language as tl

    tiles = (
        (64, 64, 4, 4),
        (128, 32, 4, 4),
        (128, 64, 4, 3),
        (128, 64, 4, 4),
        (128, 64, 8, 3),
        (256, 32, 8, 4),
        (256, 64, 8, 3),
        (256, 64, 8, 4),
    )
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_K": k}, num_warps=w, num_stages=s) for m, k, w, s in tiles]

    @triton.jit
    def kernel(
        x,
        w,
        bias,
        y,
        M,
        H,
        W,
        C: tl.constexpr,
        OUT: tl.constexpr,
        O_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        pixel = rows % (H * W)
        h, wi = pixel // W, pixel % W
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        chunks: tl.constexpr = C // BLOCK_K
        for step in range(9 * chunks):
            tap, k0 = step // chunks, (step % chunks) * BLOCK_K
            dy, dx = tap // 3 - 1, tap % 3 - 1
            hh, ww = h + dy, wi + dx
            inside = (rows < M) & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
            source = (rows + dy * W + dx) * C + k0
            a = tl.load(x + source[:, None] + ks[None, :], mask=inside[:, None], other=0.0)
            b = tl.load(w + (tap * C + k0 + ks)[:, None] * O_PAD + cols[None, :])
            acc = tl.dot(a, b, acc)
        acc += tl.load(bias + cols)[None, :]
        keep = (rows < M)[:, None] & (cols < OUT)[None, :]
        tl.store(y + rows[:, None] * OUT + cols[None, :], acc.to(y.dtype.element_ty), mask=keep)

    launch = kernel if fixed else triton.autotune(configs=configs, key=["M", "C", "O_PAD"])(kernel)

    def prepare(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(9*C, O_PAD) weight with output channels contiguous and padded to a multiple of 16; the padded bias."""
        out_channels, in_channels = weight.shape[:2]
        unit = 16 if out_channels <= 128 else 128
        padded = -(-out_channels // unit) * unit
        stacked = torch.zeros(9 * in_channels, padded, device=weight.device, dtype=weight.dtype)
        stacked[:, :out_channels] = weight.permute(2, 3, 1, 0).reshape(9 * in_channels, out_channels)
        full_bias = torch.zeros(padded, device=weight.device, dtype=torch.float32)
        full_bias[:out_channels] = bias.float()
        return stacked, full_bias, padded

    def conv(x: torch.Tensor, prepared: tuple[torch.Tensor, torch.Tensor, int], out_channels: int) -> torch.Tensor:
        stacked, full_bias, padded = prepared
        batch, channels, height, width = x.shape
        if not x.is_contiguous(memory_format=torch.channels_last) or channels % 32:
            raise ValueError("triton_conv3x3 wants a channels-last input with a multiple of 32 channels")
        y = torch.empty(
            batch, out_channels, height, width, device=x.device, dtype=x.dtype, memory_format=torch.channels_last
        )
        rows = batch * height * width
        block_n = min(padded, 128)
        grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]), padded // block_n)  # noqa: E731
        launch[grid](
            x, stacked, full_bias, y, rows, height, width, channels, out_channels, padded, block_n, **(fixed or {})
        )
        return y

    return prepare, conv


@functools.cache
def autotuned_conv3x3():
    """One autotuned ``triton_conv3x3`` for the whole process (tuned once per shape)."""
    return triton_conv3x3()


def variants(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, names: tuple[str, ...]
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each asked-for way of computing ``conv2d(x, weight, bias, padding=1)`` as a callable."""
    plain = lambda: F.conv2d(x, weight, bias, padding=1)  # noqa: E731
    chosen: dict[str, Callable[[], torch.Tensor]] = {}
    for name in names:
        if name.startswith("cudnn"):
            chosen[name] = plain
        elif name == "inductor triton template":
            import torch._inductor.config as inductor

            with inductor.patch(max_autotune=True, max_autotune_conv_backends="TRITON"):
                compiled = torch.compile(lambda a: F.conv2d(a, weight, bias, padding=1), dynamic=False)
                compiled(x)
            chosen[name] = lambda: compiled(x)
        elif name == "triton implicit gemm":
            prepare, conv = autotuned_conv3x3()
            prepared = prepare(weight, bias)
            chosen[name] = lambda: conv(x, prepared, weight.shape[0])
    return chosen


def time_shape(layer: str, in_channels: int, out_channels: int, side: int, names: tuple[str, ...]) -> list[dict]:
    """Every variant of one convolution: ms per frame, TFLOP/s, relative error against fp32."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(FRAMES, in_channels, side, side, device="cuda", generator=generator, dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(out_channels, in_channels, 3, 3, device="cuda", generator=generator) / (9 * in_channels) ** 0.5
    weight = weight.half().contiguous(memory_format=torch.channels_last)
    bias = torch.randn(out_channels, device="cuda", generator=generator).half()
    reference = F.conv2d(x[:2].float(), weight.float(), bias.float(), padding=1)
    flops = 2.0 * FRAMES * out_channels * side * side * in_channels * 9
    rows = []
    for name, fn in variants(x, weight, bias, names).items():
        torch.backends.cudnn.benchmark = "benchmark" in name
        torch.backends.cudnn.benchmark_limit = 0 if name.endswith("all") else 10
        try:
            y = fn()
            ms = statistics.median(gpu_time(fn, 20))
        except Exception as exc:  # a variant that cannot run here is reported, not fatal
            rows.append({"layer": layer, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(f"  {layer:<34} {name:<26} failed: {rows[-1]['error'][:120]}", flush=True)
            continue
        error = float((y[:2].float() - reference).norm() / reference.norm())
        rows.append(
            {
                "layer": layer,
                "shape": f"{in_channels}->{out_channels} 3x3 at {side}x{side}",
                "variant": name,
                "ms_per_frame": ms / FRAMES,
                "tflops": flops / ms / 1e9,
                "rel_err": error,
            }
        )
        print(
            f"  {layer:<34} {name:<26} {ms / FRAMES:.4f} ms/frame {flops / ms / 1e9:6.1f} TFLOP/s err {error:.1e}",
            flush=True,
        )
    torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit = False, 10
    return rows


class TritonConv3x3(nn.Module):
    """An ``nn.Conv2d`` (3x3, padding 1) computed by ``triton_conv3x3``."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        prepare, self.conv = autotuned_conv3x3()
        self.out_channels = conv.out_channels
        self.prepared = prepare(conv.weight.detach(), conv.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.contiguous(memory_format=torch.channels_last), self.prepared, self.out_channels)


def render_with_triton_convs() -> dict:
    """Graphed, compiled warp+decode at 16 frames: ms per frame as it is and with the 64-output layers in Triton."""
    from bench.common.parts import render_inputs_with_motion
    from bench.common.stats import psnr
    from engine.backends.torch_backend import TorchBackend
    from engine.engine import random_checkpoints

    generator = torch.Generator(device="cuda").manual_seed(0)
    feature, kp_s, kp_d = render_inputs_with_motion(FRAMES, torch.device("cuda"), generator)
    result, frames = {}, {}
    for name in ("cudnn", "triton 64-output layers"):
        backend = TorchBackend(random_checkpoints(), device="cuda", networks=("warp_network", "decoder"))
        if name.startswith("triton"):
            decoder = backend.network("decoder")
            decoder.up_1.conv_0 = TritonConv3x3(decoder.up_1.conv_0)
            decoder.up_1.conv_1 = TritonConv3x3(decoder.up_1.conv_1)
            decoder.conv_img[0] = TritonConv3x3(decoder.conv_img[0])
        backend.capture_render((FRAMES,))
        ms = statistics.median(gpu_time(lambda net=backend: net.render(feature, kp_s, kp_d), 20))
        frames[name] = backend.render(feature, kp_s, kp_d).float().clone()
        result[f"{name}: graphed warp+decode ms per frame at {FRAMES}"] = ms / FRAMES
        print(f"render, {name}: {ms / FRAMES:.3f} ms/frame", flush=True)
        del backend
    result["PSNR triton vs cudnn render dB"] = psnr(frames["triton 64-output layers"], frames["cudnn"], peak=1.0)
    print(f"render PSNR triton vs cudnn: {result['PSNR triton vs cudnn render dB']:.1f} dB", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.conv_kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the rows here as JSON")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--layers", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--render", action="store_true", help="also the graphed render with the Triton convolutions")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    result: dict = {
        "what": __doc__.split("\n\n")[1].replace("\n", " "),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "frames": FRAMES,
    }
    if args.render:
        result["render"] = render_with_triton_convs()
    rows = result["rows"] = []
    with torch.inference_mode():
        for layer in args.layers:
            rows += time_shape(layer, *SHAPES[layer], tuple(args.variants))
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))
    print("\n| layer | variant | ms/frame | TFLOP/s | rel. error |\n|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['layer']} | {row['variant']} | failed | | |")
        else:
            print(
                f"| {row['layer']} | {row['variant']} | {row['ms_per_frame']:.4f} | {row['tflops']:.0f} | "
                f"{row['rel_err']:.1e} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

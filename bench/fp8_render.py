"""Where FP8 keeps the picture: warp + decode with chosen convolutions in e4m3, emulated, against the fp32 modules.

``python -m bench.fp8_render [--device cpu|cuda] [--frames N] [--out FILE.json]``

Each convolution is emulated as an FP8 tensor-core convolution computes it: weights rounded to e4m3 with one scale
per output channel, the input rounded to e4m3 with one scale per call (calibrated on that call's input), products
summed in fp32, then rescaled. The bench reports two things. The first is each convolution's relative error alone,
on the input the fp32 network gives it. The second is the PSNR of whole frames, against the plain fp32 modules, with
FP8 in each candidate set of convolutions. Issue 21's gate is 40 dB; fp16 gives 59-61 dB. The inputs are the
speed table's (``bench.render_profile --parts speed``): random features and keypoints with a small motion. Random
weights: the figures show where the precision goes, not what a face would lose.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from bench.common.parts import render_inputs_with_motion
from bench.common.stats import psnr
from engine.backends.aot_calls import RenderCall
from engine.engine import random_checkpoints
from engine.networks import OFFICIAL_FILENAMES, load_network

E4M3_MAX = 448.0
"""The largest finite e4m3 value: a scale maps a tensor's largest magnitude onto it."""
MAIN_UP = tuple(f"decoder.{block}.{conv}" for block in ("up_0", "up_1") for conv in ("conv_0", "conv_1", "conv_s"))
"""The up blocks' main convolutions: the slow 64- and 256-channel ones at 128^2 and 256^2 (issue 21)."""
SETS: dict[str, Callable[[str], bool]] = {
    **{f"{one} alone": (lambda name, one=one: name == one) for one in (*MAIN_UP, "decoder.conv_img.0")},
    "decoder.up_1.conv_0 and conv_1": lambda name: name in ("decoder.up_1.conv_0", "decoder.up_1.conv_1"),
    "the up blocks' main convolutions": lambda name: name in MAIN_UP,
    "the decoder at 128^2 and 256^2, their SPADE convolutions too": lambda name: name.startswith(
        ("decoder.up_0.", "decoder.up_1.")
    ),
    "every decoder convolution": lambda name: name.startswith("decoder."),
    "every convolution": lambda name: True,
}
"""Candidate sets of convolutions to run in FP8, by layer name."""


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the nearest e4m3 value (round to nearest even), back in ``x``'s dtype."""
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """One scale per output channel (dim 0) mapping that channel's largest weight onto ``E4M3_MAX``."""
    return weight.abs().amax(dim=tuple(range(1, weight.dim()))).clamp_min(1e-12) / E4M3_MAX


def activation_scale(x: torch.Tensor) -> torch.Tensor:
    """One scale for the whole input, mapping its largest magnitude onto ``E4M3_MAX``."""
    return x.abs().amax().clamp_min(1e-12) / E4M3_MAX


def fp8_conv(conv: nn.Conv2d | nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` as an FP8 convolution computes it: e4m3 weights (per channel) and input (per call), fp32 sums."""
    sw, sx = weight_scales(conv.weight), activation_scale(x)
    per_channel = (-1,) + (1,) * (conv.weight.dim() - 1)
    y = conv._conv_forward(e4m3(x / sx), e4m3(conv.weight / sw.view(per_channel)), None)
    y = y * (sx * sw).view(1, -1, *(1,) * (x.dim() - 2))
    return y if conv.bias is None else y + conv.bias.view(1, -1, *(1,) * (x.dim() - 2))


def convolutions(module: nn.Module) -> dict[str, nn.Conv2d | nn.Conv3d]:
    """Every 2-D and 3-D convolution of ``module``, by name."""
    return {name: m for name, m in module.named_modules() if isinstance(m, (nn.Conv2d, nn.Conv3d))}


def layer_errors(render: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[dict]:
    """Each convolution's relative error in FP8 alone, on the input the fp32 network gives it, with its shape."""
    rows, hooks = [], []

    def measure(name: str):
        def hook(conv, args, output):
            error = (fp8_conv(conv, args[0]) - output).norm() / output.norm().clamp_min(1e-30)
            rows.append(
                {
                    "layer": name,
                    "shape": f"{tuple(args[0].shape[1:])}->{tuple(output.shape[1:])}",
                    "rel_error": float(error),
                }
            )

        return hook

    for name, conv in convolutions(render).items():
        hooks.append(conv.register_forward_hook(measure(name)))
    try:
        render(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return rows


def render_with_fp8(render: nn.Module, inputs: tuple[torch.Tensor, ...], names: Iterable[str]) -> torch.Tensor:
    """Frames from ``render`` with the convolutions ``names`` emulated in FP8 (every other one in fp32)."""
    convs = convolutions(render)
    hooks = [convs[n].register_forward_hook(lambda conv, args, output: fp8_conv(conv, args[0])) for n in names]
    try:
        return render(*inputs)
    finally:
        for h in hooks:
            h.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fp8_render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--frames", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    folder = random_checkpoints()
    nets = [
        load_network(n, folder / OFFICIAL_FILENAMES[n], device, torch.float32, fold_batchnorm=True)
        for n in ("warp_network", "decoder")
    ]
    render = RenderCall(*nets).eval()
    inputs = render_inputs_with_motion(args.frames, device)
    started = time.perf_counter()
    result: dict = {
        "what": __doc__.split("\n\n")[0],
        "device": str(device),
        "frames": args.frames,
        "weights": "random",
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    with torch.inference_mode():
        reference = render(*inputs)
        result["layers"] = layer_errors(render, inputs)
        names = list(convolutions(render))
        result["frame_psnr_db"] = {}
        for label, chosen in SETS.items():
            frames = render_with_fp8(render, inputs, [n for n in names if chosen(n)])
            result["frame_psnr_db"][label] = psnr(frames, reference, peak=1.0)
            print(f"FP8 in {label}: frame PSNR {result['frame_psnr_db'][label]:.1f} dB against fp32", flush=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print("\n| convolution | shape | relative error in e4m3 |\n|---|---|---|")
    for row in sorted(result["layers"], key=lambda r: -r["rel_error"]):
        print(f"| {row['layer']} | {row['shape']} | {row['rel_error']:.2e} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

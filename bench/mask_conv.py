"""Ways to run the dense motion's mask + occlusion convolution (7x7 over depth planes) on cuDNN, timed per frame (it chose the column stack in depth_planes).

``python -m bench.mask_conv [--frames 16] [--out FILE.json]`` (CUDA). The 2-D form in
``engine/networks/depth_planes.py`` is one 7x7 convolution, 144 -> 184 channels, over 16 depth
planes of 64x64 per frame; cuDNN runs it with an sm80 "indexed" kernel at ~250 TFLOP/s. Variants:
padded channel counts (to reach other kernels), and the 7 column shifts stacked as channels
(1008 inputs) followed by a 7x1 convolution. Each variant's result is compared with the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.networks.depth_planes import column_stack, column_weight
from engine.timing import gpu_time

PLANES, SIDE, K = 16, 64, 7
IN, OUT = 144, 184
USEFUL_FLOP = 2 * PLANES * SIDE * SIDE * (142 * 22 * 343 + 142 * 16 * 49)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mask_conv", description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dev, dt = torch.device("cuda"), torch.float16
    n = args.frames * PLANES
    torch.manual_seed(0)
    x = torch.randn(n, IN, SIDE, SIDE, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(OUT, IN, K, K, device=dev, dtype=dt) * 0.01).contiguous(memory_format=torch.channels_last)
    reference = F.conv2d(x, w, padding=K // 2).float()

    def padded(cin: int, cout: int):
        xp = F.pad(x, (0, 0, 0, 0, 0, cin - IN)).contiguous(memory_format=torch.channels_last)
        wp = F.pad(w, (0, 0, 0, 0, 0, cin - IN, 0, cout - OUT)).contiguous(memory_format=torch.channels_last)
        return lambda: F.conv2d(xp, wp, padding=K // 2)[:, :OUT]

    def padded_input_inside(cout: int):
        wp = F.pad(w, (0, 0, 0, 0, 0, 0, 0, cout - OUT)).contiguous(memory_format=torch.channels_last)
        return lambda: F.conv2d(x, wp, padding=K // 2)[:, :OUT]

    def columns(cout: int, include_stack: bool):
        wc = column_weight(F.pad(w, (0, 0, 0, 0, 0, 0, 0, cout - OUT))).contiguous(memory_format=torch.channels_last)
        stacked = column_stack(x, K)
        if include_stack:
            return lambda: F.conv2d(column_stack(x, K), wc, padding=(K // 2, 0))[:, :OUT]
        return lambda: F.conv2d(stacked, wc, padding=(K // 2, 0))[:, :OUT]

    variants = {
        "baseline 144->184": padded(IN, OUT),
        "out 192": padded_input_inside(192),
        "out 256": padded_input_inside(256),
        "in 192 out 192": padded(192, 192),
        "in 256 out 256": padded(256, 256),
        "in 160 out 192": padded(160, 192),
        "column stack (1008) + 7x1, out 184": columns(OUT, True),
        "column stack (1008) + 7x1, out 192": columns(192, True),
        "7x1 over a stacked input only, out 192": columns(192, False),
    }
    rows = []
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        for name, fn in variants.items():
            with torch.no_grad():
                err = float((fn().float() - reference).norm() / reference.norm())
                ms = statistics.median(gpu_time(fn, 20)) / args.frames
            rows.append({"variant": name, "cudnn_benchmark": benchmark, "ms_per_frame": ms,
                         "useful_tflops": USEFUL_FLOP / ms / 1e9, "rel_err_vs_baseline": err})
            print(f"{name:42} bench={benchmark!s:5} {ms:7.4f} ms/frame {USEFUL_FLOP / ms / 1e9:6.1f} TFLOP/s useful  err {err:.1e}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"frames": args.frames, "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the GPU time goes: the top kernels of warp+decode, and the LMDM window with TF32 + torch.compile.

``python -m bench.profile`` prints two short tables (random weights).
"""

from __future__ import annotations

import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from engine.timing import gpu_time
from engine.backends.torch_backend import TorchBackend
from engine.engine import random_checkpoints


def main() -> int:
    backend = TorchBackend(random_checkpoints(), device="cuda")
    batch = 8
    f_s = torch.randn(batch, 32, 16, 64, 64, device="cuda", dtype=backend.dtype)
    kp = torch.rand(batch, 21, 3, device="cuda", dtype=backend.dtype) - 0.5
    with torch.inference_mode():
        for _ in range(3):
            backend.decode(backend.warp(f_s, kp, kp))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            backend.decode(backend.warp(f_s, kp, kp))
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    lmdm = backend.network("lmdm")
    compiled = torch.compile(lmdm, dynamic=False)
    results = lmdm_variants_tf32(backend, compiled)
    for name, value in results.items():
        print(f"lmdm  {name:<40} {value:9.3f}")
    return 0


def lmdm_variants_tf32(backend: TorchBackend, compiled) -> dict[str, float]:
    """The 25-step window graph with TF32 matmuls, eager modules vs torch.compile."""
    from bench.latency import window_sampler

    out = {}
    cond = torch.randn(1, 80, backend.cond_width, device="cuda")
    cond_frame = torch.randn(1, 265, device="cuda") * 0.3
    for name, fn in (("tf32 eager graph ms", backend.network("lmdm")), ("tf32 compiled graph ms", compiled)):
        sampler = window_sampler(fn, backend.cond_width, torch.device("cuda"), 25, (1, 4, 8))
        out[name] = statistics.median(gpu_time(lambda: sampler(cond_frame, cond), 20))
        for b in (4, 8):
            cb, fb = cond.expand(b, -1, -1).contiguous(), cond_frame.expand(b, -1).contiguous()
            out[name + f" b{b}"] = statistics.median(gpu_time(lambda: sampler(fb, cb), 10))
    return out


if __name__ == "__main__":
    sys.exit(main())

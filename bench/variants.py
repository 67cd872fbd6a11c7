"""Experiments: which execution settings make the torch backend fastest (render and LMDM window).

``python -m bench.variants [--compile]`` times each variant of the same computation on the GPU
and prints a table; the winners become the torch backend's defaults. Random weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.latency import window_sampler
from engine.timing import gpu_time
from engine.backends.torch_backend import TorchBackend
from engine.engine import random_checkpoints


def render_variants(backend: TorchBackend, batch: int, use_compile: bool) -> dict[str, float]:
    device, dtype = backend.device, backend.dtype
    f_s = torch.randn(batch, 32, 16, 64, 64, device=device, dtype=dtype)
    kp_s = torch.rand(batch, 21, 3, device=device, dtype=dtype) * 1.4 - 0.7
    kp_d = kp_s + 0.02 * torch.randn_like(kp_s)
    warp, decoder = backend.network("warp_network"), backend.network("decoder")
    out: dict[str, float] = {}

    def run(f, k1, k2):
        with torch.inference_mode():
            return decoder(warp(f, k1, k2))

    torch.backends.cudnn.benchmark = False
    out["nchw, benchmark off"] = statistics.median(gpu_time(lambda: run(f_s, kp_s, kp_d), 10)) / batch
    torch.backends.cudnn.benchmark = True
    out["nchw, benchmark on"] = statistics.median(gpu_time(lambda: run(f_s, kp_s, kp_d), 10)) / batch
    f_cl = f_s.contiguous(memory_format=torch.channels_last_3d)
    out["channels-last input, benchmark on"] = statistics.median(gpu_time(lambda: run(f_cl, kp_s, kp_d), 10)) / batch
    feature = warp(f_cl, kp_s, kp_d)
    with torch.inference_mode():
        out["warp only"] = statistics.median(gpu_time(lambda: warp(f_cl, kp_s, kp_d), 10)) / batch
        out["decoder only, nchw"] = statistics.median(gpu_time(lambda: decoder(feature.contiguous()), 10)) / batch
        fcl = feature.contiguous(memory_format=torch.channels_last)
        out["decoder only, channels-last"] = statistics.median(gpu_time(lambda: decoder(fcl), 10)) / batch
    if use_compile:
        started = time.perf_counter()
        cwarp, cdec = torch.compile(warp), torch.compile(decoder)

        def crun():
            with torch.inference_mode():
                return cdec(cwarp(f_cl, kp_s, kp_d))

        crun()
        out["compile time s"] = time.perf_counter() - started
        out["torch.compile (default), channels-last"] = statistics.median(gpu_time(crun, 10)) / batch
    return out


def lmdm_variants(backend: TorchBackend, use_compile: bool) -> dict[str, float]:
    """The 25-step window as one CUDA graph: fp32, TF32 and torch.compile, with each one's change of the result."""
    device = backend.device
    lmdm = backend.network("lmdm")
    cond = torch.randn(1, 80, backend.cond_width, device=device)
    cond_frame = torch.randn(1, 265, device=device) * 0.3
    x = torch.randn(1, 80, 265, device=device)
    out: dict[str, float] = {}

    def measure(name: str, denoiser) -> torch.Tensor:
        sampler = window_sampler(denoiser, backend.cond_width, device)
        result = sampler(cond_frame, cond, x)
        out[f"{name} graph ms"] = statistics.median(gpu_time(lambda: sampler(cond_frame, cond, x), 20))
        return result

    torch.backends.cuda.matmul.allow_tf32 = False
    reference = measure("fp32", lmdm)
    torch.backends.cuda.matmul.allow_tf32 = True
    out["tf32 rel err"] = float((measure("tf32", lmdm) - reference).norm() / reference.norm())
    torch.backends.cuda.matmul.allow_tf32 = False
    if use_compile:
        started = time.perf_counter()
        result = measure("compiled fp32", torch.compile(lmdm, dynamic=False))
        out["compile time s"] = time.perf_counter() - started
        out["compiled rel err"] = float((result - reference).norm() / reference.norm())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.variants", description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="also try torch.compile (minutes of compilation)")
    parser.add_argument("--compile-render", action="store_true", help="torch.compile the warp and decoder too (slow to compile)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    compile_render = args.compile_render
    backend = TorchBackend(random_checkpoints(), device="cuda")
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    results["render_ms_per_frame"] = render_variants(backend, args.batch, compile_render)
    print(json.dumps(results["render_ms_per_frame"], indent=1), flush=True)
    results["lmdm"] = lmdm_variants(backend, args.compile)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    for section in ("lmdm", "render_ms_per_frame"):
        for name, value in results[section].items():
            print(f"{section:>20}  {name:<45} {value:10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

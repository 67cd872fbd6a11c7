"""GPU compute of the engine's parts on one GPU: LMDM windows, render batches, avatar loads (not latency:
bench.latency).

``python -m bench.compute [--backend torch|tensorrt] [--avatar NAME_OR_DIR] [--out FILE.json]``
prints a table last and writes every number (with the hardware) to JSON. Random weights
unless --checkpoints is given: timings do not depend on the weights' values.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common.memory import memory
from bench.common.parts import engine_window_sampler, time_loads
from bench.common.stats import summary
from bench.common.targets import AVATAR_LOAD_MS, LMDM_WINDOW_MS, RENDER_MS_PER_FRAME
from engine.diffusion.ddim import DDIMSampler
from engine.engine import Engine
from engine.motion.vector import MOTION_DIM
from engine.timebase import DEFAULT_STEPS, SEQ_FRAMES
from engine.timing import gpu_time

RENDER_BATCHES = (1, 5, 8, 16)


def ceilings(device: torch.device) -> dict[str, float]:
    """The card's fp16 matrix rate and copy bandwidth, measured once: the ceilings the parts' figures are read
    against."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.float16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.float16)
    mm = statistics.median(gpu_time(lambda: a @ b, 10))
    src = torch.randn(1 << 28, device=device)
    dst = torch.empty_like(src)
    cp = statistics.median(gpu_time(lambda: dst.copy_(src), 10))
    return {"fp16_matmul_tflops": 2 * 8192**3 / mm / 1e9, "copy_gbps": 2 * src.numel() * 4 / cp / 1e6}


def bench_lmdm(engine: Engine, repeat: int) -> dict[str, dict[str, float]]:
    """One 80-frame window (B=1) at the engine's step count: eager loop vs one CUDA graph, and a batch of 4."""
    device, width = engine.device, engine.cond_width
    cond = torch.randn(1, SEQ_FRAMES, width, device=device)
    cond_frame = torch.randn(1, MOTION_DIM, device=device)
    graphed = engine_window_sampler(engine)
    out = {"graphed": summary(gpu_time(lambda: graphed(cond_frame, cond), repeat))}
    ddim = DDIMSampler(engine.steps, seed=0, device=device)
    out["eager"] = summary(gpu_time(lambda: ddim(engine.backend.lmdm, cond_frame, cond), max(3, repeat // 5)))
    for batch in (4,):
        conds = cond.expand(batch, -1, -1).contiguous()
        frames = cond_frame.expand(batch, -1).contiguous()
        out[f"graphed_b{batch}"] = summary(gpu_time(lambda: graphed(frames, conds), max(5, repeat // 2)))
    return out


def bench_render(engine: Engine, repeat: int) -> dict[str, dict[str, float]]:
    """Warp+decode per batch size, captured as CUDA graphs; ms per call and per frame."""
    backend, device, dtype = engine.backend, engine.device, engine.backend.dtype
    if backend.capabilities.render_graphs:
        backend.capture_render(RENDER_BATCHES)
    out = {}
    for batch in RENDER_BATCHES:
        f_s = torch.randn(batch, 32, 16, 64, 64, device=device, dtype=dtype)
        kp_s = torch.rand(batch, 21, 3, device=device) * 1.4 - 0.7
        kp_d = kp_s + 0.02 * torch.randn_like(kp_s)
        stats = summary(gpu_time(lambda: backend.render(f_s, kp_s, kp_d), repeat))
        stats["ms_per_frame"] = stats["p50_ms"] / batch
        stats["frames_per_s"] = 1000.0 / stats["ms_per_frame"]
        out[f"b{batch}"] = stats
    f_s = torch.randn(8, 32, 16, 64, 64, device=device, dtype=dtype)
    kp = torch.rand(8, 21, 3, device=device) - 0.5
    feature = backend.warp(f_s, kp, kp)
    out["warp_only_b8"] = summary(gpu_time(lambda: backend.warp(f_s, kp, kp), max(5, repeat // 2)))
    out["decode_only_b8"] = summary(gpu_time(lambda: backend.decode(feature), max(5, repeat // 2)))
    return out


def bench_avatar_load(folder: str, device: torch.device, runs: int = 20) -> dict[str, dict]:
    """Loading a cached avatar onto the GPU, synchronised, after one warm-up (with and without the CRC check)."""
    return {
        "verified" if verify else "unverified": summary(time_loads(folder, device, runs, verify))
        for verify in (True, False)
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compute", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=("torch", "tensorrt"))
    parser.add_argument("--plans", type=Path, help="plan folder for the tensorrt backend")
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints (default: random weights)")
    parser.add_argument("--avatar", help="cached avatar name or folder whose load is timed too")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    return parser.parse_args(argv)


NO_GPU = (
    "bench.compute measures a GPU; torch sees none here. On a CPU: python -m bench.loop_ops --avatar DIR "
    "(the runtime loop's operators per tick), python -m bench.stitch --device cpu, "
    "python -m bench.encode --device cpu, python -m bench.render_profile --parts decoder --device cpu"
)


def measure(args: argparse.Namespace) -> dict:
    """Every part on this machine's GPU; the results as a JSON-ready dict."""
    device = torch.device("cuda")
    engine = Engine.from_checkpoints(
        args.checkpoints, device=device, backend=args.backend, steps=args.steps, plans=args.plans
    )
    results: dict[str, object] = {
        "hardware": {
            "gpu": torch.cuda.get_device_name(),
            "capability": torch.cuda.get_device_capability(),
            "host": platform.node(),
        },
        "software": {"torch": torch.__version__, "cuda": torch.version.cuda, "backend": args.backend},
        "weights": "official" if args.checkpoints else "random",
        "steps": args.steps,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results["ceilings"] = ceilings(device)
    if args.avatar:
        results["avatar_load_ms"] = bench_avatar_load(args.avatar, device)
    results["lmdm_window"] = bench_lmdm(engine, args.repeat)
    results["render"] = bench_render(engine, args.repeat)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    results = measure(args)
    results["memory_gib"] = memory(torch.device("cuda"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    print(table(results))
    return 0


def table(r: dict) -> str:
    """The short table: what each target asks for, and what was measured."""
    lm, rd = r["lmdm_window"], r["render"]
    best = min((v for k, v in rd.items() if k.startswith("b")), key=lambda v: v["ms_per_frame"])
    rows = [
        ("GPU", r["hardware"]["gpu"], ""),
        (
            "fp16 matmul TFLOP/s / copy GB/s",
            f"{r['ceilings']['fp16_matmul_tflops']:.0f} / {r['ceilings']['copy_gbps']:.0f}",
            "",
        ),
        (
            f"LMDM window {r['steps']} steps, graphed (ms, p50/p99)",
            f"{lm['graphed']['p50_ms']:.2f} / {lm['graphed']['p99_ms']:.2f}",
            f"<= {LMDM_WINDOW_MS}",
        ),
        ("LMDM 4 windows, graphed (ms, p50)", f"{lm['graphed_b4']['p50_ms']:.2f}", ""),
        ("LMDM window eager (ms)", f"{lm['eager']['p50_ms']:.2f}", ""),
        (
            "render best (ms/frame, frames/s)",
            f"{best['ms_per_frame']:.2f}, {best['frames_per_s']:.0f}",
            f"<= {RENDER_MS_PER_FRAME}",
        ),
        ("render b5 hop (ms)", f"{rd['b5']['p50_ms']:.2f}", ""),
    ]
    if "memory_gib" in r:
        mem = r["memory_gib"]
        peak = f"{mem['max_reserved']} / {mem['process_nvidia_smi']}"
        rows.append(("GPU memory, peak reserved / process (GiB)", peak, ""))
    if "avatar_load_ms" in r:
        load = r["avatar_load_ms"]
        rows.append(
            (
                "avatar load, verified / not (ms)",
                f"{load['verified']['p50_ms']:.2f} / {load['unverified']['p50_ms']:.2f}",
                f"< {AVATAR_LOAD_MS}",
            )
        )
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{name:<{width}}  {value:>22}  {target}".rstrip() for name, value, target in rows)


if __name__ == "__main__":
    sys.exit(main())

"""GPU compute of the engine's parts on one GPU: LMDM windows, render batches, avatar loads (sessions: bench.runtime).

``python -m bench.latency [--backend torch|tensorrt] [--avatar NAME_OR_DIR] [--out FILE.json]``
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

from engine.diffusion.ddim import DDIMSampler, denoiser_step
from engine.diffusion.graphed import BucketedSampler
from engine.engine import Engine
from engine.timing import gpu_time

RENDER_BATCHES = (1, 5, 8, 16)


def summary(times: list[float]) -> dict[str, float]:
    """Median, p90, p99 and max of a list of milliseconds."""
    ordered = sorted(times)
    pick = lambda q: ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]  # noqa: E731
    return {"median": statistics.median(ordered), "p90": pick(0.9), "p99": pick(0.99), "max": ordered[-1], "n": len(ordered)}


def ceilings(device: torch.device) -> dict[str, float]:
    """The card's fp16 matrix rate and copy bandwidth, measured once (METHOD.md)."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.float16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.float16)
    mm = statistics.median(gpu_time(lambda: a @ b, 10))
    src = torch.randn(1 << 28, device=device)
    dst = torch.empty_like(src)
    cp = statistics.median(gpu_time(lambda: dst.copy_(src), 10))
    return {"fp16_matmul_tflops": 2 * 8192**3 / mm / 1e9, "copy_gbps": 2 * src.numel() * 4 / cp / 1e6}


def window_sampler(denoiser, cond_width: int, device: torch.device, steps: int = 25, batches: tuple[int, ...] = (1, 4)):
    """``sample(cond_frame, cond, x=None)``: graph-captured windows with seed-0 noise, for timing a bare denoiser."""
    ddim = DDIMSampler(steps, seed=0, device=device)
    sampler = BucketedSampler(ddim.schedule, denoiser_step(denoiser), cond_width, ddim.shape)
    return _seeded(sampler, ddim, batches)


def engine_window_sampler(engine: Engine, batches: tuple[int, ...] = (1, 4)):
    """``sample(cond_frame, cond, x=None)`` through the sampler the runtime uses (window conditions prepared once)."""
    return _seeded(engine.sampler(), DDIMSampler(engine.steps, seed=0, device=engine.device), batches)


def _seeded(sampler: BucketedSampler, ddim: DDIMSampler, batches: tuple[int, ...]):
    sampler.capture(batches)

    def sample(cond_frame: torch.Tensor, cond: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        batch = cond.shape[0]
        x = ddim.initial_noise(batch) if x is None else x
        return sampler(x, cond_frame, cond, ddim.step_noise.expand(-1, batch, -1, -1))

    return sample


def bench_lmdm(engine: Engine, repeat: int) -> dict[str, dict[str, float]]:
    """One 80-frame window (B=1) at the engine's step count: eager loop vs one CUDA graph, and a batch of 4."""
    device, width = engine.device, engine.cond_width
    cond = torch.randn(1, 80, width, device=device)
    cond_frame = torch.randn(1, 265, device=device)
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
    if hasattr(backend, "capture_render"):
        backend.capture_render(RENDER_BATCHES)
    out = {}
    for batch in RENDER_BATCHES:
        f_s = torch.randn(batch, 32, 16, 64, 64, device=device, dtype=dtype)
        kp_s = torch.rand(batch, 21, 3, device=device) * 1.4 - 0.7
        kp_d = kp_s + 0.02 * torch.randn_like(kp_s)
        stats = summary(gpu_time(lambda: backend.render(f_s, kp_s, kp_d), repeat))
        stats["ms_per_frame"] = stats["median"] / batch
        stats["frames_per_s"] = 1000.0 / stats["ms_per_frame"]
        out[f"b{batch}"] = stats
    f_s = torch.randn(8, 32, 16, 64, 64, device=device, dtype=dtype)
    kp = torch.rand(8, 21, 3, device=device) - 0.5
    feature = backend.warp(f_s, kp, kp)
    out["warp_only_b8"] = summary(gpu_time(lambda: backend.warp(f_s, kp, kp), max(5, repeat // 2)))
    out["decode_only_b8"] = summary(gpu_time(lambda: backend.decode(feature), max(5, repeat // 2)))
    return out


def bench_avatar_load(folder: str, device: torch.device, runs: int = 20) -> dict[str, float]:
    """Loading a cached avatar onto the GPU, synchronised, after one warm-up (with and without the CRC check)."""
    from avatars.cache import load_avatar

    out = {}
    for verify in (True, False):
        load_avatar(folder, device, verify=verify)
        times = []
        for _ in range(runs):
            torch.cuda.synchronize()
            started = time.perf_counter()
            load_avatar(folder, device, verify=verify)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - started) * 1000)
        out["verified" if verify else "unverified"] = summary(times)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=("torch", "tensorrt"))
    parser.add_argument("--plans", type=Path, help="plan folder for the tensorrt backend")
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints (default: random weights)")
    parser.add_argument("--avatar", help="cached avatar name or folder (default: register the astronaut)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "bench.latency measures a GPU; torch sees none here. On a CPU: python -m bench.loop_ops --avatar DIR "
            "(the runtime loop's operators per tick), python -m bench.stitch --device cpu, "
            "python -m bench.encode --device cpu, python -m bench.render_profile --parts decoder --device cpu",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda")
    engine = Engine.from_checkpoints(args.checkpoints, device=device, backend=args.backend, steps=args.steps, plans=args.plans)
    results: dict[str, object] = {
        "hardware": {"gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(), "host": platform.node()},
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
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    """The short table: what each target asks for, and what was measured."""
    lm, rd = r["lmdm_window"], r["render"]
    best = min((v for k, v in rd.items() if k.startswith("b")), key=lambda v: v["ms_per_frame"])
    rows = [
        ("GPU", r["hardware"]["gpu"], ""),
        ("fp16 matmul TFLOP/s / copy GB/s", f"{r['ceilings']['fp16_matmul_tflops']:.0f} / {r['ceilings']['copy_gbps']:.0f}", ""),
        (f"LMDM window {r['steps']} steps, graphed (ms, median/p99)", f"{lm['graphed']['median']:.2f} / {lm['graphed']['p99']:.2f}", "<= 15"),
        ("LMDM window eager (ms)", f"{lm['eager']['median']:.2f}", ""),
        ("render best (ms/frame, frames/s)", f"{best['ms_per_frame']:.2f}, {best['frames_per_s']:.0f}", "<= 2.5, >= 400"),
        ("render b5 hop (ms)", f"{rd['b5']['median']:.2f}", "<= 20 (+paste)"),
    ]
    if "avatar_load_ms" in r:
        load = r["avatar_load_ms"]
        rows.append(("avatar load, verified / not (ms)", f"{load['verified']['median']:.2f} / {load['unverified']['median']:.2f}", "< 10"))
    width = max(len(a) for a, _, _ in rows)
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>22}  {target}")


if __name__ == "__main__":
    sys.exit(main())

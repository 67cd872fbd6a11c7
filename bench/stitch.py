"""What stitching costs the runtime's loop per tick: each session's frames stitched on their own, or all in one call.

``python -m bench.stitch [--device cuda|cpu] [--sessions 8] [--frames 5] [--repeats 200] [--out FILE.json]``

The loop stitches every session's due frames each tick (5 per live session per 200 ms hop);
``MotionStitcher`` runs per session, ``stitch_posed`` then poses and stitches all sessions' frames
at once. For ``--sessions`` image-avatar stitchers (random avatar motion, the stitching network on
random weights) this counts the ATen operators one tick dispatches (on CUDA, about one kernel
launch each) and times the loop thread's CPU per tick (``time.thread_time``, with the GPU
synchronised after each tick), per-session calls against one batched tail. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from bench.common.lmdm_ops import AtenCounter
from engine.motion.stitching import MotionStitcher, stitch_posed
from engine.motion.vector import join_motion
from engine.networks.stitch_network import StitchingNetwork

WIDTHS = {"scale": 1, "pitch": 66, "yaw": 66, "roll": 66, "t": 3, "exp": 63}


def avatar_motion(seed: int, frames: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Random avatar motion in the stitcher's layout (pose logits, small expressions, scale near 1, kp)."""
    g = torch.Generator().manual_seed(seed)
    parts = {k: torch.randn(frames, w, generator=g) for k, w in WIDTHS.items()}
    parts["exp"] = parts["exp"] * 0.05
    parts["scale"] = 1 + 0.2 * torch.rand(frames, 1, generator=g)
    parts["kp"] = torch.randn(frames, 63, generator=g) * 0.3
    return {k: v.to(device) for k, v in parts.items()}


def tick(
    stitchers: list[MotionStitcher], driving: list[torch.Tensor], rows: torch.Tensor, batched: bool, stitch
) -> None:
    """One tick's stitching of every session's frames."""
    if batched:
        stitch_posed([s.pose(d, rows) for s, d in zip(stitchers, driving)], stitch)
    else:
        for stitcher, frames in zip(stitchers, driving):
            stitcher(frames, rows)


def measure(device: torch.device, sessions: int, frames: int, repeats: int, batched: bool) -> dict:
    """ATen operators of one tick and the loop thread's CPU milliseconds per tick (median and p90)."""
    net = StitchingNetwork().to(device).eval()
    stitch = lambda x_s, x_d: net(x_s, x_d)  # noqa: E731
    stitchers = [MotionStitcher(avatar_motion(i, 1, device), stitch=stitch) for i in range(sessions)]
    driving = [join_motion(avatar_motion(100 + i, frames, device)) for i in range(sessions)]
    rows = torch.zeros(frames, dtype=torch.int64, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(5):
            tick(stitchers, driving, rows, batched, stitch)
        counter = AtenCounter()
        with counter:
            tick(stitchers, driving, rows, batched, stitch)
        times = []
        for _ in range(repeats):
            sync()
            started = time.thread_time()
            tick(stitchers, driving, rows, batched, stitch)
            sync()
            times.append((time.thread_time() - started) * 1000)
    times.sort()
    ops = sum(n for name, n in counter.ops.items() if name != "view")
    return {
        "batched": batched,
        "ops_per_tick": ops,
        "cpu_ms_p50": round(times[len(times) // 2], 3),
        "cpu_ms_p90": round(times[int(len(times) * 0.9)], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stitch", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--frames", type=int, default=5, help="frames per session per tick")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # the loop thread's view: one thread launching ops (put back after: main may run in a test)
    try:
        runs = [measure(device, args.sessions, args.frames, args.repeats, batched) for batched in (False, True)]
    finally:
        torch.set_num_threads(threads)
    report = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "sessions": args.sessions,
        "frames_per_session": args.frames,
        "runs": runs,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    print(f"\n{report['device']}, {args.sessions} sessions x {args.frames} frames per tick, torch {report['torch']}")
    print("| stitching | ATen ops per tick | loop CPU ms per tick p50 | p90 |")
    print("|---|---|---|---|")
    for run in report["runs"]:
        name = (
            "all sessions in one call (stitch_posed)" if run["batched"] else "each session on its own (MotionStitcher)"
        )
        print(f"| {name} | {run['ops_per_tick']} | {run['cpu_ms_p50']} | {run['cpu_ms_p90']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

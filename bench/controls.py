"""Session controls on the device: what they cost per hop, and live sessions whose controls change every hop.

``python -m bench.controls [--device cuda] [--sessions 4] [--seconds 10] [--steps 25] [--out FILE.json]``

1. Stitching one 5-frame hop with default controls against every frame control on (pose offsets and
   scales, an expression offset, mouth damping, a clip range, a blink table, a fade), timed alone.
2. ``--sessions`` live sessions fed speech in real time for ``--seconds``, twice: with the default
   controls, then with a thread changing every session's controls (window and frame controls alike)
   every 200 ms and sending one bad change per second (refused, the session goes on). Reported per run:
   frames per session per second, deadline misses, tick GPU p50/p99, graph captures and torch.compile
   graphs added after warm-up (both must stay 0: controls are data, never new shapes).
Random weights and the stand-in audio encoder: the timings do not depend on the weights' values.
Runs on the CPU too (slowly; there the live runs miss their deadlines by construction).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import threading
import time
from pathlib import Path

import torch

from bench.common.sessions import HOP, load_bench_avatar, push_in_real_time, speech
from bench.common.stats import wall_times
from engine.controls import ControlError, Controls, stitch_controls
from engine.motion.stitching import MotionStitcher, blink_schedule, fade_alphas
from engine.motion.vector import MOTION_DIM
from engine.runtime import Runtime, RuntimeConfig, SessionClosed
from engine.timebase import DEFAULT_STEPS, HOP_FRAMES
from engine.timing import gpu_time


def every_control(rng: random.Random) -> Controls:
    """A valid, random setting of every control (tables included)."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    return Controls(
        pitch=rng.uniform(-15, 15),
        yaw=rng.uniform(-20, 20),
        roll=rng.uniform(-10, 10),
        pitch_scale=rng.uniform(0.5, 1.5),
        yaw_scale=rng.uniform(0.5, 1.5),
        roll_scale=rng.uniform(0.5, 1.5),
        expression=torch.randn(63, generator=g) * 0.005,
        vad_alpha=rng.uniform(0.3, 1.0),
        emotion=rng.choice(["happy", "sad", "neutral", ("happy", "surprise")]),
        blink_table=torch.randn(15, 63, generator=g) * 0.01,
        blink_gaps=rng.choice([0, 20, (10, 40)]),
        fade_in=rng.choice([0, 10]),
        fade_target=rng.choice(["source", "first"]),
        clip_range=torch.stack([-torch.ones(MOTION_DIM) * 5, torch.ones(MOTION_DIM) * 5]),
        fix_kp_cond=rng.choice([0, 1, 3]),
        fix_kp_cond_dims=rng.choice([None, (0, 202)]),
    )


def stitch_cost(runtime: Runtime, avatar, repeat: int = 50) -> dict:
    """Milliseconds to stitch one hop of one session: default controls vs every frame control on."""
    device = runtime.device
    loaded = runtime.avatars.acquire(avatar)
    try:
        motion = loaded.source_motion.expand(HOP_FRAMES, -1).contiguous() + 0.01 * torch.randn(
            HOP_FRAMES, MOTION_DIM, device=device
        )
        rows = torch.zeros(HOP_FRAMES, dtype=torch.int64, device=device)
        busy = every_control(random.Random(0))
        table = torch.tensor(busy.blink_table, device=device)
        stitchers = {
            "default controls": (MotionStitcher(loaded.source, stitch=runtime.engine.backend.stitch), None),
            "every frame control": (
                MotionStitcher(
                    loaded.source,
                    stitch=runtime.engine.backend.stitch,
                    blink_table=table,
                    blink_indices=blink_schedule(3000, 15, 20).to(device),
                    fade_target="source",
                    controls=stitch_controls(busy, device),
                ),
                fade_alphas(torch.arange(HOP_FRAMES, device=device), fade_in=10),
            ),
        }
        timer = gpu_time if device.type == "cuda" else (lambda run, repeat: wall_times(run, device, repeat))
        result = {}
        for name, (stitcher, alpha) in stitchers.items():
            result[name] = round(statistics.median(timer(lambda s=stitcher, a=alpha: s(motion, rows, a), repeat)), 4)
        return result
    finally:
        runtime.avatars.release(loaded)


def live_run(runtime: Runtime, avatar, count: int, seconds: float, change: bool) -> dict:
    """``count`` live sessions fed in real time; with ``change``, every session's controls change every hop."""
    audio, rate = speech(seconds + 2)
    sessions = [runtime.open_session(avatar, live=True, overlap=75, seed=i) for i in range(count)]
    received = [0] * count
    failed = [False] * count
    stop = threading.Event()
    changes = {"applied": 0, "refused": 0}
    dynamo = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    def consume(i: int) -> None:
        while not stop.is_set():
            try:
                if sessions[i].next_frame(timeout=0.5) is not None:
                    received[i] += 1
            except TimeoutError:
                continue
            except SessionClosed:
                failed[i] = not stop.is_set()
                return

    def steer() -> None:
        rng = random.Random(1)
        k = 0
        while not stop.wait(HOP):
            k += 1
            for session in sessions:
                session.set_controls(every_control(rng))
                changes["applied"] += 1
                if k % 5 == 0:
                    try:
                        session.update_controls(yaw=400.0)
                    except ControlError:
                        changes["refused"] += 1

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(count)]
    if change:
        threads.append(threading.Thread(target=steer, daemon=True))
    for t in threads:
        t.start()
    time.sleep(1.0)
    base = runtime.metrics()
    elapsed, refused = push_in_real_time(sessions, audio, rate, int(seconds / HOP))
    metrics = runtime.metrics()
    stop.set()
    for session in sessions:
        session.close()
    for t in threads:
        t.join()
    return {
        "sessions": count,
        "controls_changing": change,
        "seconds": round(elapsed, 2),
        "frames_per_session_per_s": round(sum(received) / count / (elapsed + 1.0), 2),
        "deadline_misses": metrics.get("deadline_misses", 0) - base.get("deadline_misses", 0),
        "session_failures": sum(failed),
        "pushes_refused": refused,
        "control_changes": changes["applied"],
        "bad_changes_refused": changes["refused"],
        "tick_gpu_ms_p50": metrics["tick_gpu_ms_p50"],
        "tick_gpu_ms_p99": metrics["tick_gpu_ms_p99"],
        "captures_after_warmup": metrics["captures_after_warmup"] - base["captures_after_warmup"],
        "dynamo_graphs_after_warmup": torch._dynamo.utils.counters["stats"]["unique_graphs"] - dynamo,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controls", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    config = RuntimeConfig(admission=False, progress=device.type == "cuda")
    result: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    }
    result["torch"], result["weights"] = torch.__version__, "random (timings only)"
    with Runtime.from_checkpoints(None, device=device, steps=args.steps, config=config) as runtime:
        avatar = load_bench_avatar(None, device)
        result["stitch_ms_per_hop"] = stitch_cost(runtime, avatar)
        result["live"] = [live_run(runtime, avatar, args.sessions, args.seconds, change) for change in (False, True)]
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(
        f"\nstitch one {HOP_FRAMES}-frame hop: "
        + ", ".join(f"{k} {v} ms" for k, v in result["stitch_ms_per_hop"].items())
    )
    print(
        "| controls | sessions | frames/s/session | deadline misses | failures | changes (bad refused) | tick GPU "
        "p50/p99 ms | captures/graphs after warm-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in result["live"]:
        print(
            f"| {'changing every hop' if row['controls_changing'] else 'default'} | {row['sessions']} | "
            f"{row['frames_per_session_per_s']} | {row['deadline_misses']} | {row['session_failures']} | "
            f"{row['control_changes']} ({row['bad_changes_refused']}) | "
            f"{row['tick_gpu_ms_p50']}/{row['tick_gpu_ms_p99']} | "
            f"{row['captures_after_warmup']}/{row['dynamo_graphs_after_warmup']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

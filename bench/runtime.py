"""The serving runtime on one GPU: start times, the live-session curve, independence, memory, no compiles mid-stream.

``python -m bench.runtime --avatar DIR --out FILE.json [--seconds 20] [--sessions 1 2 4 8 12 16 24]``

GPU memory is broken down as the start builds it (the CUDA context, the networks and compiled packages, each
warm-up step's reserve, the allocator's pools after warm-up) and reported at its peak beside every speed.
Each live session is fed 200 ms of speech per 200 ms of wall time by one feeder thread and
drained by its own consumer thread. Per session count it reports frames delivered against the
clock, deadline misses, tick wall and GPU span (p50/p99) and the GPU busy share. Random
weights and the stand-in audio encoder: timings do not depend on the weights' values.
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common.memory import gib, memory, pools
from bench.common.sessions import HOP, push_in_real_time, speech
from bench.common.stats import psnr
from engine.engine import Engine
from engine.latency import LOW, MODES
from engine.runtime import OutOfMemoryAtStart, Runtime, RuntimeConfig
from engine.runtime.session import Session


def offline_frames(runtime: Runtime, avatar, seeds: list[int], seconds: float) -> list[torch.Tensor]:
    """Offline sessions side by side on the same audio; each one's frames, stacked."""
    audio, rate = speech(seconds)
    sessions = [runtime.open_session(avatar, live=False, overlap=75, seed=s) for s in seeds]
    for session in sessions:
        session.push_audio(audio, rate, block=True)
        session.end()
    results: list[list[torch.Tensor]] = [[] for _ in sessions]

    def drain(i: int) -> None:
        while (frame := sessions[i].next_frame(timeout=120)) is not None:
            results[i].append(frame.image.clone())

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [torch.stack(r) for r in results]


def live_run(
    runtime: Runtime, avatar, count: int, seconds: float, stagger: bool = False, latency: str = "faithful"
) -> dict:
    """``count`` live sessions in ``latency`` mode fed in real time for ``seconds``; what the clock and the GPU saw.

    ``stagger``: sessions open ``1/count`` of a hop apart and push on their own phase (as a server's
    independent clients do) instead of all at once.
    """
    audio, rate = speech(seconds + 2)
    sessions = []
    for i in range(count):
        sessions.append(runtime.open_session(avatar, live=True, seed=i, latency=latency))
        if stagger:
            time.sleep(HOP / count)
    received = [0] * count
    stop = threading.Event()

    def consume(i: int, session: Session) -> None:
        while not stop.is_set():
            try:
                if session.next_frame(timeout=0.5) is not None:
                    received[i] += 1
            except TimeoutError:
                continue

    consumers = [threading.Thread(target=consume, args=(i, s), daemon=True) for i, s in enumerate(sessions)]
    for t in consumers:
        t.start()
    time.sleep(1.0)
    base = runtime.metrics()
    pushes = int(seconds / HOP)
    elapsed, refused = push_in_real_time(sessions, audio, rate, pushes, stagger)
    metrics = runtime.metrics()
    stop.set()
    for session in sessions:
        session.close()
    for t in consumers:
        t.join()
    time.sleep(0.3)
    return {
        "sessions": count,
        "staggered": stagger,
        "seconds": round(elapsed, 2),
        "frames_per_session_per_s": round(sum(received) / count / (elapsed + 1.0), 2),
        "deadline_misses": metrics.get("deadline_misses", 0) - base.get("deadline_misses", 0),
        "frames_dropped": metrics.get("frames_dropped", 0),
        "pushes_refused": refused,
        "tick_wall_ms_p50": metrics["tick_wall_ms_p50"],
        "tick_wall_ms_p99": metrics["tick_wall_ms_p99"],
        "tick_cpu_ms_p50": metrics["tick_cpu_ms_p50"],
        "tick_cpu_ms_p99": metrics["tick_cpu_ms_p99"],
        "tick_gpu_ms_p50": metrics["tick_gpu_ms_p50"],
        "tick_gpu_ms_p99": metrics["tick_gpu_ms_p99"],
        "gpu_busy": metrics["gpu_busy"],
        "captures_after_warmup": metrics["captures_after_warmup"],
        "memory_gib": memory(runtime.device),
    }


def utterance_latency(runtime: Runtime, avatar, utterances: int) -> dict:
    """One live session idling; every 1.2 s a 400 ms utterance is pushed at once: seconds from that push
    to the session handing out the utterance's first frame (speech=True), i.e. before any encoder or network."""
    audio, rate = speech(0.4)
    session = runtime.open_session(avatar, live=True, overlap=75, seed=0)
    latencies, pushed = [], None
    lock = threading.Lock()
    stop = threading.Event()

    def consume() -> None:
        nonlocal pushed
        in_speech = False
        while not stop.is_set():
            try:
                frame = session.next_frame(timeout=0.5)
            except TimeoutError:
                continue
            if frame is None:
                return
            with lock:
                if frame.speech and not in_speech and pushed is not None:
                    latencies.append(time.monotonic() - pushed)
                    pushed = None
            in_speech = frame.speech

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(1.0)
    for _ in range(utterances):
        with lock:
            pushed = time.monotonic()
        session.push_audio(audio, rate)
        time.sleep(1.2)
    stop.set()
    metrics = session.stats()
    session.close()
    consumer.join()
    ordered = sorted(latencies)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] * 1000, 1)  # noqa: E731
    return {
        "what": "push of a 400 ms utterance to an idling live session (overlap 75) -> its first speech frame handed "
        "out by session.next_frame (ms)",
        "n": len(ordered),
        "p50_ms": pick(0.5),
        "p90_ms": pick(0.9),
        "max_ms": pick(1.0),
        "deadline_misses": metrics["deadline_misses"],
        "idle_hops": metrics["idle_hops"],
    }


def session_memory(runtime: Runtime, avatar, label: str) -> dict:
    """GPU memory of the shared avatar (first session) and of each further session, after a few hops."""
    audio, rate = speech(2.0)

    def open_one(seed: int) -> Session:
        session = runtime.open_session(avatar, live=False, overlap=75, seed=seed)
        session.push_audio(audio, rate, block=True)
        for _ in range(20):
            session.next_frame(timeout=60)
        return session

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    first = open_one(0)
    torch.cuda.synchronize()
    one = torch.cuda.memory_allocated()
    second = open_one(1)
    torch.cuda.synchronize()
    two = torch.cuda.memory_allocated()
    first.close()
    second.close()
    return {"avatar": label, "first_session_mb": (one - before) / 2**20, "each_further_session_mb": (two - one) / 2**20}


def synthetic_video_avatar(frames: int, height: int, width: int, device: torch.device):
    """A 300-frame 1080p avatar of random tensors in the cache's shapes (for memory only: not a registered face)."""
    from avatars.cache import Avatar

    g = torch.Generator().manual_seed(0)
    motion = lambda w: torch.randn(frames, w, generator=g) * 0.1  # noqa: E731
    scale = 512 / 1080
    m = torch.tensor([[1 / scale, 0, 700.0], [0, 1 / scale, 100.0], [0, 0, 1]]).expand(frames, 3, 3).clone()
    return Avatar(
        name="synthetic-video-1080p",
        f_s=torch.randn(frames, 32, 16, 64, 64, generator=g) * 0.1,
        pitch=motion(66),
        yaw=motion(66),
        roll=motion(66),
        t=motion(3),
        exp=motion(63),
        scale=motion(1) + 1,
        kp=motion(63),
        M_c2o=m,
        eye_open=torch.rand(frames, 2),
        eye_ball=motion(6),
        sc=motion(63)[0],
        mask_crop=torch.ones(512, 512),
        frames=torch.randint(0, 255, (frames, height, width, 3), dtype=torch.uint8),
        is_image=False,
        manifest={},
    )


def independence_and_memory(runtime: Runtime, avatar, result: dict, save: Callable[[], object]) -> None:
    """Sessions alone vs side by side (PSNR, bit-identity of a repeat) and GPU memory per session, into ``result``."""
    device = runtime.device
    solo = [offline_frames(runtime, avatar, [s], 2.0)[0] for s in (0, 1)]
    together = offline_frames(runtime, avatar, [0, 1, 0, 1], 2.0)
    result["independence_psnr_db"] = [psnr(together[i], solo[i % 2]) for i in range(4)]
    result["solo_repeat_bit_identical"] = bool(torch.equal(offline_frames(runtime, avatar, [0], 2.0)[0], solo[0]))
    print("independence PSNR (dB) vs solo:", result["independence_psnr_db"], flush=True)
    save()

    result["memory"] = [session_memory(runtime, avatar, "512x512 image (registered)")]
    video = synthetic_video_avatar(300, 1080, 1920, device)
    result["memory"].append(session_memory(runtime, video, "300-frame 1920x1080 video (synthetic tensors)"))
    del video
    torch.cuda.empty_cache()
    print("memory:", result["memory"], flush=True)
    save()


def start_memory(runtime: Runtime, table: dict) -> None:
    """Into ``table``: each warm-up step's reserve (GiB) and what it added, the allocator's pools after warm-up."""
    last = int(table["networks"]["reserved"] * 2**30)
    steps = {}
    for step, reserve in runtime.warmup_memory.items():
        steps[step] = {
            "reserved": gib(reserve.reserved),
            "added": gib(reserve.reserved - last),
            "peak_so_far": gib(reserve.peak),
        }
        last = reserve.reserved
    table["warmup_steps"] = steps
    table["after_warmup"] = memory(runtime.device)
    table["pools_after_warmup"] = pools(runtime.device)


def print_breakdown(table: dict) -> None:
    """The start's memory, part by part (GiB)."""
    context, networks, after = table["context"], table["networks"], table["after_warmup"]
    print("\n| part | GiB |\n|---|---|")
    print(f"| CUDA context (process, nvidia-smi) | {context['process_nvidia_smi']} |")
    print(f"| network weights (allocated) | {networks['allocated']} |")
    outside = (networks["outside_torch"] or 0) - (context["outside_torch"] or 0)
    print(f"| compiled packages and libraries loaded (outside torch's allocator) | {round(outside, 3)} |")
    for step, row in table["warmup_steps"].items():
        print(f"| warm-up {step} (reserve added) | {row['added']} |")
    for pool, row in table["pools_after_warmup"].items():
        print(f"| after warm-up: pool {pool} reserved / allocated | {row['reserved']} / {row['allocated']} |")
    process, peak = after["process_nvidia_smi"], after["max_reserved"]
    print(f"| after warm-up: process (nvidia-smi) / peak reserved | {process} / {peak} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", required=True, help="a cached avatar folder (registered with the random weights)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=20.0, help="live seconds per session count")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16, 24])
    parser.add_argument("--start-only", action="store_true", help="measure the start (warm-up) and stop")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--plans", type=Path, help="a plans folder with the torch backend's compiled packages (docs/startup.md)"
    )
    parser.add_argument(
        "--runtime-sessions",
        type=int,
        help="the sessions the runtime is sized for (RuntimeConfig."
        "sessions; default: every bucket, or as many sessions as the GPU's memory holds)",
    )
    parser.add_argument(
        "--memory-only", action="store_true", help="the start's memory breakdown and each session's, then stop"
    )
    parser.add_argument(
        "--latency-only", action="store_true", help="measure the utterance latency of one live session and stop"
    )
    parser.add_argument("--live-only", action="store_true", help="only the live-session runs")
    parser.add_argument(
        "--stagger",
        action="store_true",
        help="each live run twice: sessions in phase, then opened and pushed out of phase",
    )
    parser.add_argument("--latency", choices=sorted(MODES), default="faithful", help="the live sessions' latency mode")
    args = parser.parse_args(argv)
    from avatars.cache import load_avatar

    process_start = time.perf_counter()
    device = torch.device("cuda")
    result: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    torch.zeros(1, device=device)
    result["memory_gib"] = {"context": memory(device)}
    engine = Engine.from_checkpoints(None, device=device, compile_networks=not args.no_compile, plans=args.plans)
    result["memory_gib"]["networks"] = memory(device)
    try:
        runtime = Runtime(engine, RuntimeConfig(admission=False, sessions=args.runtime_sessions))
    except OutOfMemoryAtStart as exc:
        print(f"error: {exc}", flush=True)
        return 2
    config = runtime.config
    result["sized_for"] = {
        "sessions": config.sessions,
        "window_buckets": config.window_buckets,
        "render_buckets": config.render_buckets,
    }
    result["start_seconds"] = round(time.perf_counter() - process_start, 2)
    start_memory(runtime, result["memory_gib"])
    result["networks"] = runtime.engine.backend.packages_status
    result["warmup_seconds"] = runtime.warmup_seconds
    result["window_ms"], result["render_ms"] = runtime.window_ms, runtime.render_ms
    result["capacity_overlap75"] = runtime.capacity(75)
    result["capacity_low_latency"] = runtime.capacity(LOW.overlap)
    save = lambda: args.out.write_text(json.dumps(result, indent=2))  # noqa: E731
    save()
    print(
        f"start {result['start_seconds']} s (warm-up {runtime.warmup_seconds:.1f} s; {result['networks']}); capacity "
        f"{result['capacity_overlap75']}",
        flush=True,
    )
    print_breakdown(result["memory_gib"])
    if args.start_only:
        runtime.close()
        return 0
    avatar = load_avatar(args.avatar, device)
    if args.memory_only:
        result["memory"] = [session_memory(runtime, avatar, "512x512 image (registered)")]
        result["memory_gib"]["after_sessions"] = memory(device)
        save()
        print("memory:", result["memory"], flush=True)
        runtime.close()
        return 0
    if args.latency_only:
        result["utterance_latency"] = utterance_latency(runtime, avatar, 20)
        save()
        print(result["utterance_latency"], flush=True)
        runtime.close()
        return 0
    dynamo = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    if not args.live_only:
        independence_and_memory(runtime, avatar, result, save)
    result["live"] = []
    for count in args.sessions:
        for stagger in (False, True) if args.stagger else (False,):
            row = {"latency": args.latency, **live_run(runtime, avatar, count, args.seconds, stagger, args.latency)}
            result["live"].append(row)
            save()
            print(row, flush=True)
    result["dynamo_graphs_added_after_warmup"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - dynamo
    result["captures_after_warmup"] = runtime.metrics()["captures_after_warmup"]
    runtime.close()
    save()
    print(
        "\n| sessions | phases | frames/s/session | deadline misses | tick wall p50/p99 ms | loop CPU p50/p99 ms | "
        "tick GPU p50/p99 ms | GPU busy |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in result["live"]:
        print(
            f"| {row['sessions']} | {'staggered' if row['staggered'] else 'together'} | "
            f"{row['frames_per_session_per_s']} | {row['deadline_misses']} | "
            f"{row['tick_wall_ms_p50']}/{row['tick_wall_ms_p99']} | {row['tick_cpu_ms_p50']}/{row['tick_cpu_ms_p99']} "
            "| "
            f"{row['tick_gpu_ms_p50']}/{row['tick_gpu_ms_p99']} | {row['gpu_busy']} |"
        )
    print(
        f"compiles/captures after warm-up: dynamo graphs +{result['dynamo_graphs_added_after_warmup']}, captures "
        f"+{result['captures_after_warmup']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

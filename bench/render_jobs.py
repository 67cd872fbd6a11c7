"""Render jobs on a live service: a clip submitted -> its MP4 downloaded, on an idle service and beside live streams.

``python -m bench.render_jobs [--avatar DIR] [--plans DIR | --synthetic] --live 10 --out FILE.json``

Starts ``python -m apps.serve --avatar AVATAR --sessions 0 --renders DIR --no-admission`` and renders the newsroom
clip (the bundled speech looped to 7.84 s) through ``apps.render --service``'s client, timed from the upload to the
MP4 written here: twice on the idle service, then once while ``--live`` sessions speak (each pushed the bundled speech
on loop in real time over its WebSocket, each encoding its H.264 stream). For the live sessions it reports the
pictures their outputs repeated (shed) and the frames they released while the job ran, from the server's /metrics
before and after, the same over a window before the job (the live sessions alone: the baseline) and over one of equal
length after it, with the runtime's GPU busy share and capacity at each. Every MP4's frames are counted. ``--trace
DIR`` traces the service (``engine.trace``) and adds, for each of those three windows, where its ticks' time went and
at which stage each repeated picture was late (``bench.common.trace``). Random weights: the pictures are not a face.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import time
import wave
from pathlib import Path

import aiohttp
import av
import numpy as np

from apps.render_client import render_on_service
from bench.common.live import CPU_NOTICE, START, device_of
from bench.common.streams import feed, server_counters
from bench.common.trace import summary as trace_summary
from bench.common.trace import traced
from engine.timebase import FPS
from harness.live_server import LiveServer, metric, run_keeping_server_log
from harness.nginx import free_port

NEWSROOM_SECONDS = 7.84
SETTLE = 8.0
"""Seconds the live sessions speak before anything is measured."""
BASELINE = 6.0
"""Seconds the live sessions are measured alone, before the job."""
COUNTED = ("repeated", "released", "skipped", "deadline_misses")
"""Each live session's counters over a window: its output's repeated, released and skipped slots, and the runtime's
deadline misses (frames ready more than a frame after their clock showed them: only the GPU loop's gross lateness)."""
POLL_SECONDS = 0.2
"""How often the repeats are read while the job beside the live sessions runs."""
RUNTIME_FIGURES = ("gpu_busy", "capacity", "tick_gpu_ms_p50", "tick_gpu_ms_p99", "tick_wall_ms_p99")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.render_jobs", description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", help="cached avatar folder or portrait (default: the demo portrait)")
    parser.add_argument("--plans", type=Path, help="the torch backend's compiled packages")
    parser.add_argument("--live", type=int, default=10, help="live sessions beside the third job (0: none)")
    parser.add_argument("--clip", type=Path, help="the clip to render (default: the newsroom clip, 7.84 s)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help="the synthetic runtime in the engine core (harness.synthetic_serve): the service's path alone, on a CPU",
    )
    parser.add_argument("--output-workers", type=int, help="the service's output workers (default: its own)")
    parser.add_argument("--trace", type=Path, help="trace the service into this folder and analyse each window")
    parser.add_argument("--out", type=Path, required=True, help="write the results here as JSON")
    return parser.parse_args(argv)


def newsroom_clip(path: Path) -> Path:
    """The bundled speech looped to NEWSROOM_SECONDS, as a 16-bit WAV."""
    from engine.assets import demo_audio

    audio, rate = demo_audio()
    clip = np.concatenate([audio] * 3)[: int(NEWSROOM_SECONDS * rate)]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(clip, -1, 1) * 32767).astype(np.int16).tobytes())
    return path


def clip_seconds(path: Path) -> float:
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        return sum(f.samples for f in container.decode(stream)) / stream.codec_context.sample_rate


def frames_in(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


async def timed_job(base: str, clip: Path, out: Path, seconds: float) -> dict:
    """One job through the service's client: submit -> MP4 downloaded, and what the file holds."""
    started = time.perf_counter()
    job = await asyncio.to_thread(render_on_service, base, "anchor", clip, out)
    elapsed = time.perf_counter() - started
    frames = frames_in(out)
    return {
        "submit_to_mp4_s": round(elapsed, 3),
        "times_real_time": round(seconds / elapsed, 2),
        "job_seconds": job["seconds"],
        "job_frames_per_second": job["frames_per_second"],
        "frames": frames,
        "frames_expected": math.ceil(seconds * FPS),
    }


def shed(before: dict, after: dict, sessions: list[str]) -> dict:
    """Repeated pictures and released frames of the live sessions between two /metrics snapshots."""
    rows = []
    for name in sessions:
        a, b = server_counters(before, name), server_counters(after, name)
        rows.append({"session": name, **{k: (b[k] or 0) - (a[k] or 0) for k in COUNTED}})
    repeated, released = sum(r["repeated"] for r in rows), sum(r["released"] for r in rows)
    return {
        "repeated": repeated,
        "released": released,
        "repeated_share": round(repeated / released, 5) if released else None,
        "per_session": rows,
    }


async def repeats_over_time(server: LiveServer, sessions: list[str], done: asyncio.Event) -> list[dict]:
    """When the live sessions' repeats grew, and the running job's frame rate then: /metrics every
    ``POLL_SECONDS`` until ``done``, seconds counted from the call."""
    started, rows, last = time.perf_counter(), [], None
    while not done.is_set():
        metrics = await asyncio.to_thread(server.fetch_metrics) or {}
        repeated = sum(server_counters(metrics, name)["repeated"] or 0 for name in sessions)
        rate = metric(metrics, "ditto_render_frames_per_second")
        if last is not None and repeated > last:
            rows.append({"at_s": round(time.perf_counter() - started, 2), "repeats": repeated - last, "job_fps": rate})
        last = repeated
        await asyncio.sleep(POLL_SECONDS)
    return rows


def runtime_figures(metrics: dict) -> dict:
    """The runtime's GPU busy share (last 10 s), capacity and tick times (last 4,096 ticks) from /metrics."""
    return {f"runtime_{name}": metric(metrics, f"ditto_runtime_{name}") for name in RUNTIME_FIGURES}


async def measure(args: argparse.Namespace, work: Path) -> dict:
    from engine.assets import demo_audio, write_demo_portrait

    device = device_of(args)
    avatar = args.avatar or str(write_demo_portrait(work))
    clip = args.clip or newsroom_clip(work / "newsroom.wav")
    seconds = clip_seconds(clip)
    port = free_port()
    served = ["--avatar", avatar, "--sessions", "0", "--renders", str(work / "renders"), "--no-admission"]
    served += ["--http", f"127.0.0.1:{port}", "--device", device]
    if args.plans:
        served += ["--plans", str(args.plans)]
    if args.output_workers:
        served += ["--output-workers", str(args.output_workers)]
    module = "harness.synthetic_serve" if args.synthetic else "apps.serve"
    server = LiveServer(served, port, work / "serve.log", module=module)
    base = f"http://127.0.0.1:{port}"
    result: dict = {
        "what": "a clip as a render job of apps.serve: upload -> MP4 downloaded (apps.render --service's client)",
        "device": device,
        "clip_seconds": round(seconds, 3),
        "live_sessions": args.live,
        "output_workers": args.output_workers or "the service's default",
        "admission": "off (--no-admission)",
        "python": platform.python_version(),
        "random_weights": True,
        "runtime": "synthetic (tests/streaming/synthetic_runtime.py)" if args.synthetic else "the engine's",
    }
    if device == "cpu" and not args.synthetic:
        result["notice"] = CPU_NOTICE
    stop = asyncio.Event()
    feeders: list[asyncio.Future] = []
    windows: dict[str, tuple[float, float]] = {}
    try:
        with traced(args.trace):
            server.start()
        await asyncio.to_thread(server.wait_ready, START)
        result["idle"] = [await timed_job(base, clip, work / f"idle{i}.mp4", seconds) for i in range(2)]
        print(json.dumps({"idle": result["idle"]}), flush=True)
        if args.live:
            speech, rate = demo_audio()
            async with aiohttp.ClientSession() as http:
                opened = [
                    await (await http.post(f"{base}/sessions", json={"avatar": "anchor"})).json()
                    for _ in range(args.live)
                ]
            names = [s["id"] for s in opened]
            feeders = [asyncio.ensure_future(feed(port, 0, speech, rate, stop, url=s["urls"]["push"])) for s in opened]
            await asyncio.sleep(SETTLE)
            alone_start = server.fetch_metrics() or {}
            alone_from = time.monotonic()
            await asyncio.sleep(BASELINE)
            quiet_start = server.fetch_metrics() or {}
            quiet_from = time.monotonic()
            polled = asyncio.Event()
            timeline = asyncio.ensure_future(repeats_over_time(server, names, polled))
            busy = await timed_job(base, clip, work / "busy.mp4", seconds)  # first, to know the window's length
            polled.set()
            busy_metrics = server.fetch_metrics() or {}
            window = time.monotonic() - quiet_from
            await asyncio.sleep(window)
            quiet_end = server.fetch_metrics() or {}
            windows = {
                "live_alone_before_it": (alone_from, quiet_from),
                "live_while_the_job_ran": (quiet_from, quiet_from + window),
                "live_in_as_long_after_it": (quiet_from + window, time.monotonic()),
            }
            result["beside_live"] = {
                **busy,
                "live_alone_before_it": {**shed(alone_start, quiet_start, names), **runtime_figures(quiet_start)},
                "live_while_the_job_ran": {**shed(quiet_start, busy_metrics, names), **runtime_figures(busy_metrics)},
                "repeats_while_the_job_ran": await timeline,
                "live_in_as_long_after_it": {**shed(busy_metrics, quiet_end, names), **runtime_figures(quiet_end)},
            }
            print(json.dumps({"beside_live": result["beside_live"]}), flush=True)
    finally:
        stop.set()
        for feeder in feeders:
            feeder.cancel()
        await asyncio.gather(*feeders, return_exceptions=True)
        result["server_exit"] = await asyncio.to_thread(server.stop)
    if args.trace:
        result["trace"] = {name: trace_summary(args.trace, *span) for name, span in windows.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = run_keeping_server_log(measure, args, "render-jobs-")
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k in ("idle", "beside_live")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

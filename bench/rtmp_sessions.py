"""Many sessions streaming to RTMP at once from one server: frames, rate, drift and A/V offset of every stream, read
back.

``python -m bench.rtmp_sessions [--avatar DIR] --sessions 8 --minutes 10 --out FILE.json``

Starts nginx-rtmp and ``python -m apps.serve --listen --sessions N --rtmp ... --no-admission``
(one service: its sessions opened at start), pushes the bundled speech on loop into every session over the
WebSocket in real time (as a TTS engine would), and demuxes every RTMP stream live with PyAV
from its first packet. The measured window starts 2 s after every stream has delivered a frame.
Per stream: frames received, effective frame rate, drift (how far the arrival clock moved
against the stream's own timestamps: the median lag of the last 10 s minus that of the first
10 s, and the fitted slope), gaps in the timestamps, the A/V offset (when each picture arrives,
the end of the audio timeline received so far minus the end of that picture's frame: a frame's
audio is muxed after its picture, so -40..0 ms is in order; its median, range and change from
the first to the last 10 s), and the server's deadline misses, drops and reconnects from /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from pathlib import Path

from bench.common.live import CPU_NOTICE, STALL, START, device_of
from bench.common.streams import SETTLE, feed, server_counters, stream_report
from engine.timebase import DEFAULT_STEPS
from harness.live_server import LiveServer, metric, run_keeping_server_log
from harness.nginx import NginxRtmp, find_nginx, free_port
from harness.rtmp_read import RtmpPacketLog
from serving.server import numbered


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.rtmp_sessions", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--avatar", help="cached avatar folder or portrait image (default: the demo portrait, registered at start)"
    )
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the measured window")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="DDIM steps per window")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", type=Path, required=True, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.minutes <= 0:
        parser.error("--sessions must be at least 1 and --minutes positive")
    return args


async def measure(args: argparse.Namespace, work: Path) -> dict:
    from engine.assets import demo_audio, write_demo_portrait

    device = device_of(args)
    avatar = args.avatar or str(write_demo_portrait(work))
    speech, rate = demo_audio()
    nginx = NginxRtmp(work / "nginx", find_nginx())
    port = free_port()
    base_url = nginx.url("bench")
    server = LiveServer(
        ["--avatar", avatar, "--listen", "--sessions", str(args.sessions), "--rtmp", base_url, "--no-admission"]
        + ["--http", f"127.0.0.1:{port}", "--steps", str(args.steps), "--device", device],
        port,
        work / "serve.log",
    )
    result: dict = {
        "what": f"{args.sessions} live sessions of one process streaming to nginx-rtmp, each read back with PyAV",
        "device": device,
        "sessions": args.sessions,
        "minutes": args.minutes,
        "steps": args.steps,
        "encoder": "x264",
        "audio": "the bundled speech on loop, pushed over the WebSocket in real time (200 ms chunks)",
        "admission": "off (--no-admission): every session is opened whatever the warm-up capacity says",
        "nginx": nginx.install.origin,
        "python": platform.python_version(),
        "random_weights": True,
    }
    if device == "cpu":
        result["notice"] = CPU_NOTICE
    nginx.start()
    readers = [
        RtmpPacketLog(numbered(base_url, i, args.sessions), open_timeout=STALL, read_timeout=STALL).start()
        for i in range(args.sessions)
    ]
    stop = asyncio.Event()
    try:
        server.start()
        await asyncio.to_thread(server.wait_ready, START)
        result["metrics_answer_s"] = round(time.monotonic() - server.started_at, 2)
        feeders = [asyncio.ensure_future(feed(port, i, speech, rate, stop)) for i in range(args.sessions)]
        deadline = time.monotonic() + START
        while not all(r.log.video for r in readers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        start = max((r.log.video[0][1] for r in readers if r.log.video), default=time.monotonic()) + SETTLE
        result["first_frames_s"] = round(start - SETTLE - server.started_at, 2)
        while time.monotonic() < start + args.minutes * 60:
            await asyncio.sleep(1.0)
            if any(f.done() and f.exception() for f in feeders):
                break
        end = time.monotonic()
        metrics = server.fetch_metrics() or {}
        stop.set()
        _, blocked = await asyncio.wait(feeders, timeout=10)
        for feeder in blocked:  # held up by backpressure: its session could not keep up
            feeder.cancel()
        errors = await asyncio.gather(*feeders, return_exceptions=True)
        result["pushers_blocked_at_end"] = len(blocked)
        result["push_errors"] = [str(e) for e in errors if e and not isinstance(e, asyncio.CancelledError)]
    finally:
        stop.set()
        result["server_exit"] = await asyncio.to_thread(server.stop)
        nginx.stop()
        logs = [r.join(30) for r in readers]
    result["streams"] = []
    for i, log in enumerate(logs):
        name = str(i)
        row = {"session": i, **stream_report(log, start, end)}
        row.update(server_counters(metrics, name))
        result["streams"].append(row)
    result["runtime"] = {
        key: metric(metrics, f"ditto_runtime_{key}")
        for key in (
            "tick_wall_ms_p50",
            "tick_wall_ms_p99",
            "tick_cpu_ms_p50",
            "tick_cpu_ms_p99",
            "tick_gpu_ms_p50",
            "tick_gpu_ms_p99",
            "gpu_busy",
            "capacity",
        )
    }
    return result


def table(result: dict) -> str:
    lines = [
        f"{result['sessions']} RTMP sessions from one process: {result['device']}, steps {result['steps']}, "
        f"{result['minutes']} min measured after every stream's first frame; random weights",
    ]
    if "notice" in result:
        lines.append(result["notice"])
    lines += [
        "| session | frames | fps | drift ms | slope ms/min | A/V ms (range; change) | gaps (missing) | deadline "
        "misses | drops (session/rtmp) | reconnects |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["streams"]:
        lines.append(
            f"| {s['session']} | {s['frames']} | {s.get('fps')} | {s.get('drift_ms')} | "
            f"{s.get('drift_slope_ms_per_min')} | "
            f"{s.get('av_offset_ms')} ({s.get('av_offset_range_ms')}; {s.get('av_offset_change_ms')}) | "
            f"{s.get('timestamp_gaps')} ({s.get('frames_missing')}) | "
            f"{s['deadline_misses']} | {s['frames_dropped']}/{s['rtmp_dropped']} | {s['reconnects']} |"
        )
    lines.append(f"runtime: {result['runtime']}; first frames {result.get('first_frames_s')} s after launch")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_keeping_server_log(measure, args, "rtmp-sessions-")
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

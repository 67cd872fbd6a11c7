"""Glass-to-glass latency on loopback, end to end: a marker pushed over the WebSocket -> the frame that speaks it,
decoded.

``python -m bench.glass_to_glass [--avatar DIR] [--output KEY=VALUE,...] [--steps 25] [--utterances 10] [--duration 2]
[--viewer auto] --out FILE.json``

Starts nginx-rtmp and ``python -m apps.serve --listen --rtmp ... --webrtc ...`` (the real
server over the real runtime, random weights), then plays the part of a TTS engine: utterances
of quiet speech pushed in real time, each with a loud tone burst at its start (pushed into the
idle session) and one near its middle (in continuous speech, one frame further into the model's
200 ms hop each utterance), at known send times. Nothing hooks
into the server; each marker is found again where a viewer gets it:

* RTMP, read back with PyAV: the burst's position in the decoded AAC is the frame that speaks
  it (frame pts = audio pts), and latency is when that frame was decoded minus when the burst
  was sent.
* WebRTC, headless Chromium on the preview page (``--viewer chromium``): when the burst leaves
  the page's audio output (AudioWorklet + getOutputTimestamp); the player keeps A/V in sync, so
  that is when the frame speaking it is shown; the frame on screen at that moment is also noted
  (requestVideoFrameCallback).
* WebRTC, aiortc viewer (``--viewer aiortc``; not a browser, for machines with none): when the
  burst arrives in the decoded audio, and when the very frame speaking it (found by its luma
  hash in the RTMP stream) is decoded.

The first marker of the run is the first push into an idle session ("first push"). The split:
when the session's clock shows the speech (by construction the same for every utterance: the
model's speech depth, 485 ms at overlap 75, plus the runtime's lead, from /metrics), the outputs'
release allowance, and the rest: transport and player buffer (the browser's jitter buffers from
getStats). The runtime's tick wall time and the encode time are reported beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path

from bench.common.glass_report import analyse, table
from bench.common.live import CPU_NOTICE, PUSH_RATE, STALL, START, device_of
from engine.latency import FAITHFUL, MODES
from engine.timebase import DEFAULT_STEPS
from harness.live_server import LiveServer, run_keeping_server_log
from harness.markers import utterance
from harness.nginx import NginxRtmp, find_nginx, free_port
from harness.push import Pusher
from harness.rtmp_read import PlayerLog, RtmpPlayer
from harness.viewers import AiortcViewer, ChromiumViewer, chromium_path

CHUNK_SECONDS = 0.02
IDLE_GAP = 1.5
MID_STEP = 0.04
"""Each utterance's middle marker sits one frame further into the 200 ms hop than the last (cycling), so the in-speech
markers sample every phase of the hop; a marker pushed after idle starts a hop."""


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """This benchmark's options, parsed; ``parser`` (a caller's, with options of its own) receives them."""
    parser = parser or argparse.ArgumentParser(
        prog="python -m bench.glass_to_glass", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--avatar", help="cached avatar folder or portrait image (default: the demo portrait, registered at start)"
    )
    parser.add_argument(
        "--output",
        metavar="KEY=VALUE,...",
        help="the session's output settings (size=1080p,preset=veryfast,...), passed to apps.serve (docs/output.md)",
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="DDIM steps per window")
    parser.add_argument("--latency", choices=sorted(MODES), default=FAITHFUL.name, help="the session's latency mode")
    parser.add_argument("--overlap", type=int, help="default: the latency mode's (75 faithful, 77 low)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--utterances", type=int, default=10, help="utterances pushed, two markers each")
    parser.add_argument(
        "--duration", type=float, default=2.0, help="seconds of each utterance (idle 1.5 s between them)"
    )
    parser.add_argument(
        "--viewer",
        nargs="+",
        default=["auto"],
        choices=("auto", "none", "chromium", "aiortc"),
        help="WebRTC viewers (auto: Chromium where installed, else the aiortc viewer)",
    )
    parser.add_argument(
        "--wait", type=float, help="seconds to wait for the markers after the last push (default 15; CPU 900)"
    )
    parser.add_argument(
        "--plans", type=Path, help="the torch backend's compiled packages for the server (docs/startup.md)"
    )
    parser.add_argument("--out", type=Path, required=True, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.utterances < 1:
        parser.error("--utterances must be at least 1")
    viewers = set(args.viewer) - {"none"}
    if "auto" in viewers:
        viewers = (viewers - {"auto"}) | {"chromium" if chromium_path() else "aiortc"}
    if "chromium" in viewers and chromium_path() is None:
        parser.error("--viewer chromium: no chromium here (apt-get install chromium); use --viewer aiortc")
    args.viewers = sorted(viewers)
    return args


async def measure(args: argparse.Namespace, work: Path) -> dict:
    """Run the whole measurement; the results as a JSON-ready dict."""
    from engine.assets import demo_audio, write_demo_portrait

    device = device_of(args)
    wait = args.wait if args.wait is not None else (15.0 if device == "cuda" else 900.0)
    avatar = args.avatar or str(write_demo_portrait(work))
    speech, speech_rate = demo_audio()
    if speech_rate != PUSH_RATE:
        raise ValueError(f"the demo clip is {speech_rate} Hz; expected {PUSH_RATE}")
    chunk = round(CHUNK_SECONDS * PUSH_RATE)
    plan = [
        utterance(speech, PUSH_RATE, 2 * u, args.duration, chunk, shift=(u % 5) * MID_STEP)
        for u in range(args.utterances)
    ]

    nginx = NginxRtmp(work / "nginx", find_nginx())
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"
    server = LiveServer(
        ["--avatar", avatar, "--listen", "--rtmp", nginx.url("glass"), "--webrtc", f"127.0.0.1:{http_port}"]
        + ["--steps", str(args.steps), "--latency", args.latency, "--device", device]
        + (["--overlap", str(args.overlap)] if args.overlap is not None else [])
        + (["--plans", str(args.plans)] if args.plans is not None else [])
        + (["--output", args.output] if args.output is not None else []),
        http_port,
        work / "serve.log",
    )
    result: dict = {
        "what": "glass-to-glass on loopback: a marker burst pushed over the WebSocket -> the frame that speaks it, "
        "decoded",
        "device": device,
        "steps": args.steps,
        "latency": args.latency,
        "overlap": args.overlap if args.overlap is not None else MODES[args.latency].overlap,
        "encoder": "x264",
        "output": args.output,
        "plans": str(args.plans) if args.plans is not None else None,
        "utterances": args.utterances,
        "utterance_seconds": args.duration,
        "push": f"{PUSH_RATE} Hz s16le mono, {CHUNK_SECONDS * 1000:.0f} ms chunks in real time",
        "nginx": nginx.install.origin,
        "viewers": args.viewers,
        "python": platform.python_version(),
        "random_weights": True,
    }
    if device == "cpu":
        result["notice"] = CPU_NOTICE
    viewers: list = []
    player = None
    nginx.start()
    try:
        player = RtmpPlayer(nginx.url("glass"), open_timeout=STALL, read_timeout=STALL).start()
        server.start()
        await asyncio.to_thread(server.wait_ready, START)
        result["start"] = {"metrics_answer_s": round(time.monotonic() - server.started_at, 2)}
        await _until(lambda: player.log.first_picture_at is not None, START, "the RTMP reader got no picture")
        result["start"]["first_rtmp_picture_s"] = round(player.log.first_picture_at - server.started_at, 2)
        for kind in args.viewers:
            viewer = (
                ChromiumViewer(base, work / "chromium", chromium_path()) if kind == "chromium" else AiortcViewer(base)
            )
            viewers.append(viewer)
            await (viewer.start(START) if kind == "chromium" else viewer.start())
            if kind == "aiortc":
                await _until(lambda v=viewer: v.log.first_frame_at is not None, START, "the aiortc viewer got no frame")
        await asyncio.sleep(1.0)

        pushed: list[float] = []
        async with Pusher(f"ws://127.0.0.1:{http_port}/push?session=0", PUSH_RATE, chunk) as pusher:
            for k, spoken in enumerate(plan):
                if k:
                    await pusher.pause(IDLE_GAP)
                pushed += await pusher.play(spoken.samples, spoken.marker_offsets)
            result["push_errors"] = pusher.errors
        markers = len(pushed)
        last = max(pushed)

        async def complete() -> bool:
            return all(n >= markers for n in [len(player.log.onsets)] + [await v.onsets_seen() for v in viewers])

        await _until(complete, wait, None)
        result["waited_after_last_push_s"] = round(time.monotonic() - last, 1)
        metrics = server.fetch_metrics() or {}
        result["encoder_chosen"] = next(
            (dict(k)["encoder"] for k in metrics.get("ditto_frames_encoded_total", {})), None
        )
        logs = [await v.stop() for v in viewers]
        viewers = []
    finally:
        for viewer in viewers:
            await viewer.stop()
        result["server_exit"] = await asyncio.to_thread(server.stop)
        nginx.stop()
        rtmp = player.stop() if player is not None else PlayerLog()
    result.update(analyse(rtmp, logs, pushed, metrics))
    return result


async def _until(condition, timeout: float, failure: str | None) -> None:
    """Poll ``condition`` (plain or async) until it holds; past ``timeout``, raise TimeoutError(failure), or return when
    failure is None."""
    deadline = time.monotonic() + timeout
    while not ((await held) if asyncio.iscoroutine(held := condition()) else held):
        if time.monotonic() > deadline:
            if failure is None:
                return
            raise TimeoutError(f"{failure} within {timeout:.0f} s")
        await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_keeping_server_log(measure, args, "glass-")
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    missing = result["markers_pushed"] - max((p["n"] for p in result["paths"].values()), default=0)
    if missing:
        print(f"{missing} marker(s) not found on some path within the wait; see {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

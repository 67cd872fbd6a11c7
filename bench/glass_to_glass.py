"""Glass-to-glass latency on loopback, end to end: a marker pushed over the WebSocket -> the frame that speaks it, decoded.

``python -m bench.glass_to_glass [--avatar DIR] [--steps 25] [--utterances 10] [--duration 2] [--viewer auto] --json OUT``

Starts nginx-rtmp and ``python -m streaming.serve --listen --rtmp ... --webrtc ...`` (the real
server over the real runtime, random weights), then plays the part of a TTS engine: utterances
of quiet speech pushed in real time, each with a loud tone burst at its start (pushed into the
idle session) and one in its middle (in continuous speech), at known send times. Nothing hooks
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
algorithm (by construction from the marker's place in its 200 ms hop: the rest of the hop, one
more hop for the cross-fade with the next window, 85 ms of HuBERT look-ahead; at most 485 ms at
overlap 75), compute (the runtime's tick wall time, from /metrics), encode (from /metrics), and
the rest: release pacing, transport and player buffer (the browser's jitter buffers from getStats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench.live_server import LiveServer, Metrics, metric
from bench.markers import Onset, pair, summary, utterance
from bench.nginx import NginxRtmp, find_nginx, free_port
from bench.push import Pusher
from bench.rtmp_read import PlayerLog, RtmpPlayer
from bench.viewers import AiortcViewer, ChromiumViewer, ViewerLog, chromium_path
from engine.audio.hubert import FRAME_SAMPLES, FUTURE_FRAMES, HOP_SAMPLES, SAMPLE_RATE
from engine.diffusion.windows import SEQ_FRAMES
from engine.engine import LIVE_OVERLAP
from streaming.frames import FPS

PUSH_RATE = 16_000
START = 1200.0
"""Seconds the server may take to answer and to stream its first frames (a cold compile, or the CPU)."""
STALL = 1200.0
"""Seconds the RTMP readers wait for data (a CPU stream stalls for minutes between hops); stopping nginx ends them."""
CHUNK_SECONDS = 0.02
IDLE_GAP = 1.5
HOP = HOP_SAMPLES / SAMPLE_RATE
LOOKAHEAD = (FUTURE_FRAMES * FRAME_SAMPLES + 80) / SAMPLE_RATE
ONSET_SLACK = 0.003
"""A detected onset can sit a few samples early (the 16->48 kHz resampler's and the codecs' pre-echo): one this close
before a frame or hop boundary is taken to start there (pushes after idle land exactly on hop boundaries)."""
CPU_NOTICE = "CPU run: these numbers are NOT the target (the CPU renders far below 25 fps); the run only proves the script works."


def algorithm_seconds(stream_time: float, overlap: int = LIVE_OVERLAP) -> float:
    """Delay the model itself puts between a sample at ``stream_time`` (s) and the final frame speaking it.

    The sample's hop must end (HuBERT encodes 200 ms hops), the next window must be sampled for
    the cross-fade (its stride, in whole hops: one at overlap 75), and the hop after needs its
    look-ahead (2 frames + 80 samples). At overlap 75 this is at most 485 ms.
    """
    hop_start = math.floor((stream_time + ONSET_SLACK) / HOP) * HOP
    stride = math.ceil((SEQ_FRAMES - overlap) / FPS / HOP - 1e-9) * HOP
    return hop_start + HOP - max(stream_time, hop_start) + stride + LOOKAHEAD


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.glass_to_glass", description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", help="cached avatar folder or portrait image (default: the demo portrait, registered at start)")
    parser.add_argument("--steps", type=int, default=25, help="DDIM steps per window")
    parser.add_argument("--overlap", type=int, default=LIVE_OVERLAP)
    parser.add_argument("--encoder", default="x264", choices=("auto", "x264", "nvenc"))
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--utterances", type=int, default=10, help="utterances pushed, two markers each")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of each utterance (idle 1.5 s between them)")
    parser.add_argument(
        "--viewer",
        nargs="+",
        default=["auto"],
        choices=("auto", "none", "chromium", "aiortc"),
        help="WebRTC viewers (auto: Chromium where installed, else the aiortc viewer)",
    )
    parser.add_argument("--wait", type=float, help="seconds to wait for the markers after the last push (default 15; CPU 900)")
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
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


def device_of(args: argparse.Namespace) -> str:
    """The device the server is told to use: --device, else cuda when this machine has one."""
    if args.device:
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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
    plan = [utterance(speech, PUSH_RATE, 2 * u, args.duration, chunk) for u in range(args.utterances)]

    nginx = NginxRtmp(work / "nginx", find_nginx())
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"
    server = LiveServer(
        ["--avatar", avatar, "--listen", "--rtmp", nginx.url("glass"), "--webrtc", f"127.0.0.1:{http_port}"]
        + ["--encoder", args.encoder, "--steps", str(args.steps), "--overlap", str(args.overlap), "--device", device],
        http_port,
        work / "serve.log",
    )
    result: dict = {
        "what": "glass-to-glass on loopback: a marker burst pushed over the WebSocket -> the frame that speaks it, decoded",
        "device": device,
        "steps": args.steps,
        "overlap": args.overlap,
        "encoder": args.encoder,
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
            viewer = ChromiumViewer(base, work / "chromium", chromium_path()) if kind == "chromium" else AiortcViewer(base)
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

        def complete() -> bool:
            logs = [player.log.onsets] + [v.log.onsets for v in viewers if isinstance(v, AiortcViewer)]
            return all(len(onsets) >= markers for onsets in logs)

        await _until(complete, wait, None)
        await asyncio.sleep(2.0)  # the browser plays out after its jitter buffer
        result["waited_after_last_push_s"] = round(time.monotonic() - last, 1)
        metrics = server.fetch_metrics() or {}
        result["encoder_chosen"] = next((dict(k)["encoder"] for k in metrics.get("ditto_frames_encoded_total", {})), None)
        logs = [await v.stop() for v in viewers]
        viewers = []
    finally:
        for viewer in viewers:
            await viewer.stop()
        result["server_exit"] = await asyncio.to_thread(server.stop)
        nginx.stop()
        rtmp = player.stop() if player is not None else PlayerLog()
    result.update(analyse(rtmp, logs, pushed, metrics, args.overlap))
    return result


async def _until(condition, timeout: float, failure: str | None) -> None:
    """Poll ``condition`` until it holds; past ``timeout``, raise TimeoutError(failure), or just return when failure is None."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            if failure is None:
                return
            raise TimeoutError(f"{failure} within {timeout:.0f} s")
        await asyncio.sleep(0.05)


def analyse(rtmp: PlayerLog, viewers: list[ViewerLog], pushed: list[float], metrics: Metrics, overlap: int) -> dict:
    """Per-marker latencies on every path, their summaries, and the split of the medians."""
    markers = [{"number": n, "kind": "after idle" if n % 2 == 0 else "in speech"} for n in range(len(pushed))]
    rtmp_luma: dict[str, list[int]] = {}
    for number, picture in rtmp.pictures.items():
        rtmp_luma.setdefault(picture.luma, []).append(number)

    frame_of: dict[int, int] = {}
    for (onset, arrived), n in _paired(rtmp.onsets, pushed):
        frame = math.floor((onset.time + ONSET_SLACK) * FPS)
        frame_of[n] = frame
        entry = markers[n]
        entry["stream_time_s"] = round(onset.time, 4)
        entry["frame"] = frame
        entry["algorithm_ms"] = round(algorithm_seconds(onset.time, overlap) * 1000, 1)
        picture = rtmp.pictures.get(frame)
        if picture is not None:
            entry["rtmp_ms"] = round((picture.arrival - pushed[n]) * 1000, 1)

    viewer_notes: dict = {}
    for log in viewers:
        viewer_notes[log.name] = log.stats
        for (onset, arrived), n in _paired(log.onsets, pushed):
            markers[n][f"{log.name}_audio_ms"] = round((arrived - pushed[n]) * 1000, 1)
            if log.shown:
                before = [t for t in log.shown if t <= arrived]
                if before:
                    markers[n][f"{log.name}_video_ms"] = round((before[-1] - pushed[n]) * 1000, 1)
        if log.frames:
            offset = log.frame_offset(rtmp_luma)
            viewer_notes[log.name] = {**log.stats, "rtmp_frame_offset": offset}
            if offset is not None:
                arrival = {number + offset: at for number, at, _ in log.frames}
                for n, frame in frame_of.items():
                    if frame in arrival:
                        markers[n][f"{log.name}_video_ms"] = round((arrival[frame] - pushed[n]) * 1000, 1)

    paths = {
        "rtmp_ms": "RTMP: the frame decoded by the PyAV reader",
        "chromium_audio_ms": "WebRTC, Chromium: the burst heard (WebAudio output time)",
        "chromium_video_ms": "WebRTC, Chromium: the frame on screen then (requestVideoFrameCallback)",
        "aiortc_video_ms": "WebRTC, aiortc viewer (not a browser): the frame decoded",
        "aiortc_audio_ms": "WebRTC, aiortc viewer (not a browser): the burst decoded",
    }
    compute = {q: _ms(metric(metrics, f"ditto_runtime_tick_wall_ms_{q}")) for q in ("p50", "p99")}
    encode = {q: _ms(metric(metrics, "ditto_encode_milliseconds", quantile=v, session="0")) for q, v in (("p50", "0.5"), ("p99", "0.99"))}
    fixed = (compute["p50"] or 0.0) + (encode["p50"] or 0.0)
    results = {}
    for key, label in paths.items():
        values = [m[key] / 1000 for m in markers if key in m]
        if not values:
            continue
        rest = [(m[key] - m["algorithm_ms"] - fixed) / 1000 for m in markers if key in m and "algorithm_ms" in m]
        results[key.removesuffix("_ms")] = {
            "label": label,
            **summary(values),
            "first_push_ms": markers[0].get(key),
            "after_idle": summary([m[key] / 1000 for m in markers if key in m and m["number"] % 2 == 0]),
            "in_speech": summary([m[key] / 1000 for m in markers if key in m and m["number"] % 2 == 1]),
            "rest_ms": summary(rest),
        }
    algorithm = [m["algorithm_ms"] / 1000 for m in markers if "algorithm_ms" in m]
    return {
        "markers_pushed": len(pushed),
        "paths": results,
        "split": {
            "algorithm_ms": summary(algorithm),
            "compute_tick_wall_ms": compute,
            "encode_ms": encode,
            "rest": "latency - algorithm - compute p50 - encode p50 = release pacing + transport + player buffer",
        },
        "viewers": viewer_notes,
        "rtmp_reader": {"size": rtmp.size, "pictures": len(rtmp.pictures), "onsets": len(rtmp.onsets), "error": rtmp.error},
        "server_metrics": {
            name: metric(metrics, f"ditto_session_{name}", session="0")
            for name in ("deadline_misses", "frames_dropped", "resyncs", "idle_hops", "frames_generated")
        }
        | {
            "rtmp_reconnects": metric(metrics, "ditto_rtmp_reconnects_total", session="0"),
            "rtmp_frames_dropped": metric(metrics, "ditto_frames_dropped_total", session="0", sink="rtmp"),
            "late_releases": metric(metrics, "ditto_deadline_misses_output_total", session="0"),
        },
        "markers": markers,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _paired(onsets: list[tuple[Onset, float]], pushed: list[float]):
    """(onset, arrival) with its marker number, for the onsets that pair with a marker."""
    numbers = pair([o for o, _ in onsets], pushed, [at for _, at in onsets])
    return [(item, n) for item, n in zip(onsets, numbers) if n is not None]


def table(result: dict) -> str:
    """The printed summary."""
    lines = [
        f"glass-to-glass on loopback: {result['device']}, steps {result['steps']}, overlap {result['overlap']}, "
        f"encoder {result.get('encoder_chosen') or result['encoder']}, {result['markers_pushed']} markers "
        f"({result['utterances']} utterances); random weights",
    ]
    if "notice" in result:
        lines.append(result["notice"])
    lines += ["| path | markers | p50 ms | p99 ms | max ms | first push ms | rest p50 ms |", "|---|---|---|---|---|---|---|"]
    for path in result["paths"].values():
        lines.append(
            f"| {path['label']} | {path['n']} | {path['p50_ms']} | {path['p99_ms']} | {path['max_ms']} | "
            f"{path['first_push_ms']} | {path['rest_ms']['p50_ms']} |"
        )
    split = result["split"]
    lines.append(
        f"split: algorithm p50 {split['algorithm_ms']['p50_ms']} ms (max {split['algorithm_ms']['max_ms']}; by construction, <= 485 at overlap 75)"
        f" + compute (runtime tick wall) p50/p99 {split['compute_tick_wall_ms']['p50']}/{split['compute_tick_wall_ms']['p99']} ms"
        f" + encode p50/p99 {split['encode_ms']['p50']}/{split['encode_ms']['p99']} ms + rest (pacing, transport, player buffer)"
    )
    inbound = result["viewers"].get("chromium", {}).get("inbound", {})
    buffers = {
        kind: 1000 * s["jitterBufferDelay"] / s["jitterBufferEmittedCount"]
        for kind, s in inbound.items()
        if s.get("jitterBufferEmittedCount")
    }
    if buffers:
        lines.append("Chromium jitter buffer (getStats mean): " + ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(buffers.items())))
    start = result.get("start", {})
    lines.append(
        f"start: /metrics answered {start.get('metrics_answer_s')} s after launch, first RTMP picture {start.get('first_rtmp_picture_s')} s; "
        f"server: {result['server_metrics']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="glass-") as tmp:
        try:
            result = asyncio.run(measure(args, Path(tmp)))
        finally:
            log = Path(tmp) / "serve.log"
            if log.exists():
                (args.json.parent / f"{args.json.stem}.serve.log").write_text(log.read_text(errors="replace"))
    args.json.write_text(json.dumps(result, indent=2))
    print(table(result))
    missing = result["markers_pushed"] - max((p["n"] for p in result["paths"].values()), default=0)
    if missing:
        print(f"{missing} marker(s) not found on some path within the wait; see {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Encode + mux time per frame of the live output path: colour conversion on the device, H.264, FLV mux with AAC.

``python -m bench.encode [--device cuda|cpu] [--size 1280x720] [--frames 150] [--sessions 1 8] [--threads 0 4] [--out
FILE.json]``
runs each available encoder (x264 always; NVENC where this GPU has one) as the live output does
(one thread per session, frames due every 40 ms), muxing to FLV into /dev/null, and reports
p50/p99/max per frame of: the colour conversion + host copy alone, the encoder call (which
includes it), the mux (FLV + AAC of the frame's 1920 samples of the bundled speech) and their sum. Prints a table
last and writes everything, with the hardware, to JSON. Target: p99 <= 5 ms at 1280x720 on
the GPU machine. ``--threads``: libx264 thread counts to compare (0: libx264 picks, the default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path

import av
import numpy as np
import soxr
import torch

from bench.common.stats import summary
from engine.assets import demo_audio
from engine.timebase import FPS
from streaming.encoders.colour import rgb_to_i420
from streaming.encoders.h264 import H264Settings
from streaming.encoders.nvenc import NvencUnavailable
from streaming.encoders.select import open_video_encoder
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from streaming.output import EncodedFrame, confine_torch_threads
from streaming.sinks.mux import Muxer

DISTINCT_FRAMES = 50


def camera_like(count: int, width: int, height: int, device: torch.device) -> list[torch.Tensor]:
    """Moving gradients, a moving box and light noise: harder than a flat test card, like a camera."""
    y = torch.arange(height, device=device).view(-1, 1)
    x = torch.arange(width, device=device).view(1, -1)
    generator = torch.Generator(device=device).manual_seed(0)
    frames = []
    for i in range(count):
        rgb = torch.stack([(x + 4 * i) % 256 + 0 * y, (y + 2 * i) % 256 + 0 * x, ((x + y) // 2 + i) % 256], dim=-1)
        left = i * 7 % (width - width // 4)
        rgb[height // 3 : height // 3 + height // 4, left : left + width // 4] = 255
        noise = torch.randint(-3, 4, rgb.shape, device=device, generator=generator)
        frames.append((rgb + noise).clamp(0, 255).to(torch.uint8))
    return frames


def bundled_speech_48k() -> np.ndarray:
    """The bundled speech at the sinks' 48 kHz: each frame carries its 40 ms of it, looped, as a speaking stream
    does."""
    pcm, rate = demo_audio()
    return soxr.resample(pcm, rate, AUDIO_RATE).astype(np.float32)


def convert_times(frames: list[torch.Tensor], count: int) -> list[float]:
    """Milliseconds of RGB -> I420 plus the copy to the host, alone."""
    pinned = frames[0].device.type == "cuda"
    host = torch.empty(frames[0].shape[0] * 3 // 2, frames[0].shape[1], dtype=torch.uint8, pin_memory=pinned)
    times = []
    for i in range(count):
        started = time.perf_counter()
        host.copy_(rgb_to_i420(frames[i % len(frames)]), non_blocking=pinned)
        if pinned:
            torch.cuda.current_stream().synchronize()
        times.append((time.perf_counter() - started) * 1000)
    return times


def one_session(kind: str, frames: list[torch.Tensor], count: int, out: dict, settings: H264Settings) -> None:
    """Encode and mux ``count`` frames as a live output would (one due every 40 ms); timings or the error into
    ``out``."""
    try:
        session(kind, frames, count, out, settings)
    except Exception as exc:
        out["error"] = exc


def session(kind: str, frames: list[torch.Tensor], count: int, out: dict, settings: H264Settings) -> None:
    confine_torch_threads()
    height, width = frames[0].shape[:2]
    encoder, note = open_video_encoder(kind, width, height, frames[0].device, settings)
    muxer = Muxer(os.devnull, "flv", width, height)
    speech = bundled_speech_48k()
    encode_ms, mux_ms = [], []
    start = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, start + i / FPS - time.monotonic()))
        started = time.perf_counter()
        units = encoder.encode(frames[i % len(frames)], i)
        encoded = time.perf_counter()
        for unit in units:
            audio = speech[
                np.arange(unit.index * AUDIO_SAMPLES_PER_FRAME, (unit.index + 1) * AUDIO_SAMPLES_PER_FRAME)
                % speech.size
            ]
            muxer.write(EncodedFrame(unit.index, width, height, unit.data, unit.keyframe, audio, (), False))
        done = time.perf_counter()
        encode_ms.append((encoded - started) * 1000)
        mux_ms.append((done - encoded) * 1000)
    muxer.close()
    out.update(note=note, encode=encode_ms, mux=mux_ms)


def run(kind: str, frames: list[torch.Tensor], count: int, sessions: int, x264_threads: int = 0) -> dict:
    """All sessions at once, each in its own thread; per-frame numbers pooled over sessions (warm-up dropped)."""
    results = [{} for _ in range(sessions)]
    settings = H264Settings(threads=x264_threads)
    threads = [threading.Thread(target=one_session, args=(kind, frames, count, r, settings)) for r in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if "error" in result:
            raise result["error"]
    warm = FPS
    encode = [t for r in results for t in r["encode"][warm:]]
    mux = [t for r in results for t in r["mux"][warm:]]
    total = [e + m for r in results for e, m in zip(r["encode"][warm:], r["mux"][warm:])]
    return {
        "encoder": kind,
        "x264_threads": x264_threads if kind == "x264" else None,
        "note": results[0]["note"],
        "sessions": sessions,
        "frames_per_session": count,
        "encode_ms": summary(encode),
        "mux_ms": summary(mux),
        "total_ms": summary(total),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="1280x720", help="WIDTHxHEIGHT")
    parser.add_argument("--frames", type=int, default=150, help="frames per session (the first second is warm-up)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1], help="concurrent sessions to measure, e.g. 1 8")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[0], help="libx264 thread counts to compare (0: libx264 picks)"
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    confine_torch_threads()  # measure the conversion as the encode thread runs it
    width, height = (int(v) for v in args.size.lower().split("x"))
    device = torch.device(args.device)
    frames = camera_like(DISTINCT_FRAMES, width, height, device)
    report = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "av": av.__version__,
        "size": [width, height],
        "convert_ms": summary(convert_times(frames, args.frames)),
        "runs": [],
    }
    for kind, x264_threads in [("x264", t) for t in args.threads] + [("nvenc", 0)]:
        for sessions in args.sessions:
            try:
                report["runs"].append(run(kind, frames, args.frames, sessions, x264_threads))
            except NvencUnavailable as exc:
                report["runs"].append({"encoder": kind, "sessions": sessions, "unavailable": str(exc)})
                break
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    print(f"\n{report['device']}, {width}x{height}, torch {report['torch']}, av {report['av']}")
    c = report["convert_ms"]
    print(f"colour conversion + host copy alone: p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms")
    print(
        f"{'encoder':8} {'threads':>7} {'sessions':>8} {'encode p50':>11} {'encode p99':>11} {'mux p99':>8} "
        f"{'total p50':>10} {'total p99':>10} {'max':>8}"
    )
    for r in report["runs"]:
        if "unavailable" in r:
            print(f"{r['encoder']:8} {'':>7} {r['sessions']:>8}  unavailable: {r['unavailable'][:90]}")
            continue
        e, m, t = r["encode_ms"], r["mux_ms"], r["total_ms"]
        threads = "" if r["x264_threads"] is None else r["x264_threads"]
        print(
            f"{r['encoder']:8} {threads:>7} {r['sessions']:>8} {e['p50_ms']:>11.2f} {e['p99_ms']:>11.2f} "
            f"{m['p99_ms']:>8.2f} {t['p50_ms']:>10.2f} {t['p99_ms']:>10.2f} {t['max_ms']:>8.2f}"
        )


if __name__ == "__main__":
    main()

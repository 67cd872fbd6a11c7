"""Output cost per frame at each broadcast size and x264 preset: libx264 + audio, and the scaling on the device.

``python -m bench.output_sizes [--presets P ...] [--threads 0 1] [--frames 50] [--device D] [--out FILE.json]``
measures, for a 1920x1080 anchor streamed at 1080p, 720p and 540p (and a 512x512 portrait), the median
milliseconds of one output frame as ``streaming.encoders.cost`` calibrates it (x264 with the session's
output settings at their defaults for the size, Opus, stereo AAC) for each preset and libx264 thread
count; for the anchor sizes also on the generated studio anchor (``avatars.anchor``) with only the region its
face is pasted into changing (a still-image anchor talking, the usual newsroom case); and the time to scale a
batch of 8 anchor frames to each size where they are (``--device``).
At one thread, milliseconds per frame x 25 / 1000 is the share of one core a 25 fps stream takes: what
admission divides the worker's cores by.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from engine.timebase import FPS
from streaming.encoders.colour import rgb_to_i420
from streaming.encoders.cost import encode_cost_ms
from streaming.encoders.scale import scale_frames
from streaming.output_settings import SIZES, OutputSettings

ANCHOR = (1920, 1080)
PORTRAIT = (512, 512)
SCALE_BATCH = 8
PASTE_REGION = (100, 530, 478, 908)
"""Rows and columns of the 1080p anchor that its registered face crop is pasted into (registration's M_c2o)."""


def studio_pictures(width: int, height: int, frames: int) -> list[np.ndarray]:
    """The anchor at ``width`` x ``height`` as I420, its face region moving a little and grainy in every frame."""
    import cv2

    from avatars.anchor import anchor_frame

    scale = height / ANCHOR[1]
    frame = cv2.resize(anchor_frame(), (width, height), interpolation=cv2.INTER_AREA)
    top, bottom, left, right = (round(v * scale) for v in PASTE_REGION)
    rng = np.random.default_rng(0)
    pictures = []
    for i in range(frames):
        picture = frame.copy()
        face = np.roll(frame[top:bottom, left:right], i % 5 - 2, axis=0).astype(np.int16)
        picture[top:bottom, left:right] = np.clip(face + rng.integers(-3, 4, face.shape), 0, 255)
        pictures.append(rgb_to_i420(torch.from_numpy(picture)).numpy())
    return pictures


def streams() -> list[tuple[str, tuple[int, int]]]:
    """(output size name, avatar size) of every stream measured."""
    return [*((name, ANCHOR) for name in SIZES), ("avatar", PORTRAIT)]


def scale_ms(device: torch.device, repeats: int = 5) -> dict[str, float]:
    """Median milliseconds per frame to scale a batch of 1080p frames to each named size on ``device``."""
    frames = torch.randint(0, 256, (SCALE_BATCH, ANCHOR[1], ANCHOR[0], 3), dtype=torch.uint8, device=device)
    result = {}
    for name in SIZES:
        width, height = OutputSettings(size=name).frame_size(*ANCHOR)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            scale_frames(frames, width, height)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - started)
        result[name] = round(sorted(times[1:])[repeats // 2] / SCALE_BATCH * 1000, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["ultrafast", "superfast", "veryfast"])
    parser.add_argument("--threads", type=int, nargs="+", default=[0, 1], help="libx264 threads (0: libx264 picks)")
    parser.add_argument("--frames", type=int, default=2 * FPS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    rows = []
    titles = ("size", 7), ("WxH", 10), ("kbps", 5), ("preset", 9), ("threads", 7), ("ms/frame", 8), ("studio", 7)
    print(" ".join(f"{title:>{width}}" for title, width in titles), f"{'cores':>6}")
    for name, avatar in streams():
        settings = OutputSettings(size=name)
        width, height = settings.frame_size(*avatar)
        studio = studio_pictures(width, height, args.frames) if avatar == ANCHOR else None
        for preset in args.presets:
            for threads in args.threads:
                video = replace(OutputSettings(size=name, preset=preset).video(*avatar), threads=threads)
                ms = encode_cost_ms(width, height, video, args.frames)
                still = encode_cost_ms(width, height, video, args.frames, studio) if studio else None
                rows.append(
                    {
                        "size": name,
                        "width": width,
                        "height": height,
                        "kbps": video.bitrate // 1000,
                        "preset": preset,
                        "threads": threads,
                        "ms_per_frame": ms,
                        "studio_ms_per_frame": still,
                    }
                )
                share = f"{ms * FPS / 1000:.2f}" if threads == 1 else "-"
                print(
                    f"{name:>7} {f'{width}x{height}':>10} {video.bitrate // 1000:>5} {preset:>9} {threads:>7} "
                    f"{ms:>8.2f} {still if still is not None else '-':>7} {share:>6}"
                )
    scaling = scale_ms(torch.device(args.device))
    print(f"scaling 1080p frames on {args.device}, ms per frame: {scaling}")
    if args.out:
        machine = {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}
        if torch.cuda.is_available():
            machine["gpu"] = torch.cuda.get_device_name()
        args.out.write_text(json.dumps({"machine": machine, "encode": rows, "scale_ms": scaling}, indent=1) + "\n")


if __name__ == "__main__":
    main()

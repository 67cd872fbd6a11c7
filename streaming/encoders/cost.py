"""What one output stream costs the output worker's CPU per frame, at the stream's real size and settings.

Admission needs each stream's encode cost, and libx264's cost grows with the picture (1080p has 2.25 times
720p's pixels) and with the preset (veryfast costs about twice ultrafast at 1080p, bench.output_sizes). So the
cost is measured: frames of the stream's own size, through libx264 at its own settings, plus the audio every
stream encodes (Opus for WebRTC, AAC for a muxer); sizes between the measured ones are scaled by their
pixels. The test picture moves everywhere (a sliding grain texture, a ramp and a bar), the dearest case: a
video avatar's every pixel changes; a still-image avatar's studio stays put.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import av
import numpy as np

from engine.timebase import FPS
from streaming.encoders.audio import AAC_BITRATE, AAC_BLOCK, AudioBlocks, OpusEncoder
from streaming.encoders.h264 import H264Settings
from streaming.encoders.x264 import X264Encoder
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from streaming.output_settings import OutputSettings

CALIBRATION_FRAMES = 2 * FPS
"""One GOP at the default 2 s interval: its IDR and the P-frames after it."""


def moving_pictures(width: int, height: int, frames: int) -> list[np.ndarray]:
    """``frames`` I420 pictures whose every area moves from one to the next, for the dearest encode."""
    rng = np.random.default_rng(0)
    grain = rng.integers(0, 48, (height, width), dtype=np.uint8)
    ramp = np.linspace(16, 180, width).astype(np.uint8)
    pictures = []
    for i in range(frames):
        picture = np.empty((height * 3 // 2, width), np.uint8)
        picture[:height] = np.roll(ramp, i * 8)[None, :] + np.roll(grain, i * 5, axis=1)
        picture[height:] = round(128 + 40 * np.sin(i / 10))
        top = i * 7 % max(1, height - height // 16)
        picture[top : top + height // 16, :width] = 235
        pictures.append(picture)
    return pictures


def encode_cost_ms(
    width: int,
    height: int,
    settings: H264Settings,
    frames: int = CALIBRATION_FRAMES,
    pictures: list[np.ndarray] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median milliseconds of one output frame at ``width`` x ``height``: libx264 at ``settings`` (live), the frame's
    Opus and its stereo AAC; ``pictures``: the I420 pictures to encode (default: ``moving_pictures``); ``clock``: what
    is timed (wall time by default)."""
    encoder, opus = X264Encoder(width, height, settings), OpusEncoder()
    aac, blocks = _aac(), AudioBlocks(AAC_BLOCK, channels=2)
    audio = (0.1 * np.sin(np.arange(AUDIO_SAMPLES_PER_FRAME) * 2 * np.pi * 440 / AUDIO_RATE)).astype(np.float32)
    times = []
    for index, picture in enumerate(pictures or moving_pictures(width, height, frames)):
        started = clock()
        encoder.encode_picture(encoder.prepare(picture), index)
        opus.encode(audio)
        for block in blocks.push(audio):
            aac.encode(block)
        times.append(clock() - started)
    return round(float(np.median(times)) * 1000, 3)


def stream_cost_ms(width: int, height: int, preset: str, frames: int = CALIBRATION_FRAMES) -> float:
    """Milliseconds of one core per output frame of a ``width`` x ``height`` stream at ``preset`` (its size's default
    settings): one libx264 thread timed by this thread's CPU clock, so neither the other streams of the process nor
    the rest of the machine change the figure (admission counts streams by it, ``serving.service``)."""
    settings = replace(OutputSettings(preset=preset).video(width, height), threads=1)
    return encode_cost_ms(width, height, settings, frames, clock=time.thread_time)


STANDARD_SIZES = ((1920, 1080), (1280, 720), (960, 540), (512, 512))
"""The output sizes measured at a worker's start: a 16:9 anchor at 1080p, 720p and 540p, and a 512x512 portrait."""


@dataclass(frozen=True)
class CostTable:
    """Milliseconds per output frame by (width, height, preset), each measured at its size's default output
    settings; a size not measured is estimated from the measured one of that preset nearest in pixels, in
    proportion to the pixels (libx264's work per frame is about linear in them)."""

    measured: dict[tuple[int, int, str], float]

    @classmethod
    def measure(
        cls,
        presets: tuple[str, ...],
        sizes: tuple[tuple[int, int], ...] = STANDARD_SIZES,
        frames: int = CALIBRATION_FRAMES,
    ) -> CostTable:
        """Measure every size at every preset (what a worker does once, at its start)."""
        return cls(
            {
                (width, height, preset): encode_cost_ms(
                    width, height, OutputSettings(preset=preset).video(width, height), frames
                )
                for width, height in sizes
                for preset in presets
            }
        )

    def ms(self, width: int, height: int, preset: str) -> float:
        """The cost per frame of a ``width`` x ``height`` stream at ``preset``; KeyError for a preset not measured."""
        known = {(w, h): ms for (w, h, p), ms in self.measured.items() if p == preset}
        if not known:
            raise KeyError(f"no cost measured for preset {preset!r}")
        if (width, height) in known:
            return known[width, height]
        pixels = width * height
        (w, h), ms = min(known.items(), key=lambda item: abs(item[0][0] * item[0][1] - pixels))
        return round(ms * pixels / (w * h), 3)

    def to_json(self) -> dict[str, float]:
        """The table as a message carries it: ``{"1920x1080 veryfast": ms, ...}``."""
        return {f"{w}x{h} {preset}": ms for (w, h, preset), ms in self.measured.items()}

    @classmethod
    def from_json(cls, table: dict[str, float]) -> CostTable:
        """The table ``to_json`` wrote."""
        measured = {}
        for key, ms in table.items():
            size, preset = key.split(" ")
            width, height = size.split("x")
            measured[int(width), int(height), preset] = float(ms)
        return cls(measured)


def _aac() -> av.AudioCodecContext:
    """A stereo 48 kHz AAC encoder as a muxer runs one."""
    context = av.CodecContext.create("aac", "w")
    context.sample_rate, context.layout, context.format, context.bit_rate = AUDIO_RATE, "stereo", "fltp", AAC_BITRATE
    context.open()
    return context

"""What one output stream costs the output worker's CPU per frame, at the stream's real size and settings.

Admission needs each stream's encode cost, and libx264's cost grows with the picture (1080p has 2.25 times
720p's pixels) and with the preset (veryfast is about three times ultrafast). So the cost is measured, not
scaled: frames of the stream's own size, through libx264 at its own settings, plus the audio every stream
encodes (Opus for WebRTC, AAC for a muxer). The test picture moves everywhere (a sliding grain texture, a ramp
and a bar), the dearest case: a video avatar's every pixel changes; a still-image avatar's studio stays put.
"""

from __future__ import annotations

import threading
import time

import av
import numpy as np

from engine.timebase import FPS
from streaming.encoders.audio import AAC_BITRATE, AAC_BLOCK, AudioBlocks, OpusEncoder
from streaming.encoders.h264 import H264Settings
from streaming.encoders.x264 import X264Encoder
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME

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


def encode_cost_ms(width: int, height: int, settings: H264Settings, frames: int = CALIBRATION_FRAMES) -> float:
    """Median milliseconds of one output frame at ``width`` x ``height``: libx264 at ``settings`` (live), the frame's
    Opus and its stereo AAC."""
    encoder, opus = X264Encoder(width, height, settings), OpusEncoder()
    aac, blocks = _aac(), AudioBlocks(AAC_BLOCK, channels=2)
    audio = (0.1 * np.sin(np.arange(AUDIO_SAMPLES_PER_FRAME) * 2 * np.pi * 440 / AUDIO_RATE)).astype(np.float32)
    times = []
    for index, picture in enumerate(moving_pictures(width, height, frames)):
        started = time.perf_counter()
        encoder.encode_picture(picture, index)
        opus.encode(audio)
        for block in blocks.push(audio):
            aac.encode(block)
        times.append(time.perf_counter() - started)
    return round(float(np.median(times)) * 1000, 3)


class EncodeCosts:
    """Each (size, settings)'s cost per frame, measured the first time it is asked for and remembered: what admission
    asks before it places a stream of that size and preset on this worker."""

    def __init__(self, frames: int = CALIBRATION_FRAMES) -> None:
        self.frames = frames
        self._known: dict[tuple[int, int, H264Settings], float] = {}
        self._lock = threading.Lock()

    def cost_ms(self, width: int, height: int, settings: H264Settings) -> float:
        """Milliseconds per frame of a stream at ``width`` x ``height`` encoded with ``settings``."""
        key = (width, height, settings)
        with self._lock:
            if key not in self._known:
                self._known[key] = encode_cost_ms(width, height, settings, self.frames)
            return self._known[key]


def _aac() -> av.AudioCodecContext:
    """A stereo 48 kHz AAC encoder as a muxer runs one."""
    context = av.CodecContext.create("aac", "w")
    context.sample_rate, context.layout, context.format, context.bit_rate = AUDIO_RATE, "stereo", "fltp", AAC_BITRATE
    context.open()
    return context

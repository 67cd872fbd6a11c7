"""What a LiveKit room output costs the output worker's CPU per frame, measured as an x264 stream's cost is.

A room takes the session's raw I420 pictures (``serving.rooms``) and LiveKit's WebRTC stack encodes them in the
output worker's process: VP8 (its default codec for a published track), which libwebrtc encodes with libvpx, in
the simulcast layers its SDK publishes by default, and the audio as Opus. So the cost is measured with that encoder:
libvpx VP8 in real-time mode at the speed libwebrtc sets for each layer's size, every layer of the stream's size,
plus the frame's Opus, one thread timed by its CPU clock (``streaming.encoders.cost.stream_cost_ms``'s rule). The
figure is conservative where LiveKit is cheaper: its lower layers run at 15 or 20 fps (counted here at 25), and it
may drop frames or lower a layer's size under load.
"""

from __future__ import annotations

import time
from fractions import Fraction

import av
import numpy as np

from engine.timebase import FPS
from streaming.encoders.audio import OpusEncoder
from streaming.encoders.cost import CALIBRATION_FRAMES, moving_pictures
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME

ROOM = "livekit"
"""How a room output is named where costs are kept by (width, height, x264 preset) (``serving.service``)."""
LAYER_LINES = ((480, 360), (960, 180))
"""LiveKit's default simulcast layers below the full size: from this long side on, a layer of this many lines on the
short side (its presets h360 and h180)."""
CIF_PIXELS = 352 * 288
SPEED = -6
SPEED_BELOW_CIF = -4
"""libwebrtc's VP8 speed (libvpx ``cpu-used``) on x86: -6, and -4 for a picture smaller than CIF."""
BITRATE = 1_700_000


def simulcast_layers(width: int, height: int) -> list[tuple[int, int]]:
    """The sizes LiveKit encodes a ``width`` x ``height`` track in by default, largest first (its SDK's rule: a layer
    scaled down to 360 lines from a 480-pixel long side on, one to 180 lines from 960; never scaled up)."""
    long, short = max(width, height), min(width, height)
    layers = [(width, height)]
    for from_long, lines in LAYER_LINES:
        if long >= from_long:
            scale = max(1.0, short / lines)
            layers.append((_even(width / scale), _even(height / scale)))
    return layers


def room_cost_ms(width: int, height: int, frames: int = CALIBRATION_FRAMES) -> float:
    """Milliseconds of one core per output frame of a LiveKit room at ``width`` x ``height``: VP8 of every simulcast
    layer and the frame's Opus, the median over ``frames`` moving pictures, by this thread's CPU clock."""
    layers = [(_vp8(w, h), moving_pictures(w, h, frames)) for w, h in simulcast_layers(width, height)]
    opus = OpusEncoder()
    audio = (0.1 * np.sin(np.arange(AUDIO_SAMPLES_PER_FRAME) * 2 * np.pi * 440 / AUDIO_RATE)).astype(np.float32)
    times = []
    for index in range(frames):
        started = time.thread_time()
        for encoder, pictures in layers:
            picture = av.VideoFrame.from_ndarray(pictures[index], format="yuv420p")
            picture.pts = index
            encoder.encode(picture)
        opus.encode(audio)
        times.append(time.thread_time() - started)
    return round(float(np.median(times)) * 1000, 3)


def _vp8(width: int, height: int) -> av.VideoCodecContext:
    """libvpx VP8 as libwebrtc runs it: real time, no lookahead, error resilient, one thread here."""
    context = av.CodecContext.create("libvpx", "w")
    context.width, context.height, context.pix_fmt = width, height, "yuv420p"
    context.time_base, context.framerate = Fraction(1, FPS), FPS
    context.bit_rate, context.thread_count = BITRATE, 1
    speed = SPEED if width * height >= CIF_PIXELS else SPEED_BELOW_CIF
    context.options = {"deadline": "realtime", "cpu-used": str(speed), "lag-in-frames": "0", "error-resilient": "1"}
    context.open()
    return context


def _even(pixels: float) -> int:
    """A layer's side in whole pixels, even (I420's chroma halves it)."""
    return max(2, int(pixels) // 2 * 2)

"""A LiveKit room's audio and video tracks fed in step: each frame's picture leaves when its sound starts to.

LiveKit's ``AVSynchronizer`` paces the two apart: pictures by a frame-rate controller that, after a stall, sends the
late ones at once to catch up; sound by the audio source's queue, which drains only in real time. So one stall of the
frames' producer (a busy loop, a late release) leaves the sound up to the queue's depth (100 ms) behind the pictures
for as long as the stream lasts. Here the audio source is the clock: a frame's sound is queued, and its picture is
captured when that sound begins to play out, once the sound queued before it has (``AudioSource.queued_duration`` at
the moment it is queued: LiveKit's own account of its queue). A silent frame that comes while more than a frame of
sound is still queued is dropped whole (the picture held one slot more), which gives the latency a stall added back at
the next silence.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import numpy as np
from livekit import rtc

from engine.audio.pcm import to_s16
from engine.timebase import FPS
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME

AUDIO_QUEUE_MS = 100
"""The audio source's queue (LiveKit's avatar runner's): how far a burst of frames may run ahead of real time."""
SLOT_S = 1 / FPS
OFFSETS_KEPT = 10 * FPS
"""Frames whose picture-to-sound offset the stats report the worst of."""


class RoomTracks:
    """The sources of a room's two tracks and their pacing; ``push`` one frame at a time, on one event loop."""

    def __init__(self, audio: rtc.AudioSource, video: rtc.VideoSource) -> None:
        """``audio``: 48 kHz mono (``AUDIO_QUEUE_MS`` of queue); ``video``: the frames' size."""
        self.audio, self.video = audio, video
        self._offsets: deque[float] = deque(maxlen=OFFSETS_KEPT)
        self._showing: set[asyncio.TimerHandle] = set()
        self.given_back = 0
        """Silent frames dropped to give the latency a stall added back."""

    @classmethod
    def create(cls, width: int, height: int) -> RoomTracks:
        """New sources for ``width`` x ``height`` pictures and 48 kHz mono sound."""
        return cls(rtc.AudioSource(AUDIO_RATE, 1, queue_size_ms=AUDIO_QUEUE_MS), rtc.VideoSource(width, height))

    async def push(self, picture: rtc.VideoFrame, audio: np.ndarray) -> None:
        """Queue one frame: its picture and its sound (float32 at 48 kHz, made exactly one slot long: never an empty
        audio frame, which LiveKit would drop and so put the sound a slot behind). Waits while the audio queue is
        full."""
        if not audio.any() and self.audio.queued_duration > SLOT_S:
            self.given_back += 1
            return
        samples = np.zeros(AUDIO_SAMPLES_PER_FRAME, np.float32)
        samples[: min(audio.size, samples.size)] = audio[: samples.size]
        starts = time.monotonic() + self.audio.queued_duration  # after the sound queued before it
        await self.audio.capture_frame(rtc.AudioFrame(to_s16(samples), AUDIO_RATE, 1, samples.size))
        delay = starts - time.monotonic()
        if delay <= 0:
            self._show(picture, starts, None)
            return
        loop = asyncio.get_running_loop()
        handle = loop.call_at(loop.time() + delay, lambda: self._show(picture, starts, handle))
        self._showing.add(handle)

    def _show(self, picture: rtc.VideoFrame, starts: float, handle: asyncio.TimerHandle | None) -> None:
        self._showing.discard(handle)
        self._offsets.append(abs(time.monotonic() - starts))
        self.video.capture_frame(picture)

    def stats(self) -> dict[str, float]:
        """Silent frames given back, the sound queued now and the worst recent offset of a picture from the start of
        its sound (ms)."""
        worst = max(self._offsets, default=0.0)
        return {
            "given_back": self.given_back,
            "audio_queued_ms": round(self.audio.queued_duration * 1000, 1),
            "av_offset_ms_max": round(worst * 1000, 1),
        }

    async def aclose(self) -> None:
        for handle in self._showing:
            handle.cancel()
        await self.audio.aclose()
        await self.video.aclose()

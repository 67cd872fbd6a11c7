"""A fast synthetic live session for the integration tests: the runtime session's contract, no model, no clock.

Every fifth ``take_ready`` call hands out one hop (5 frames) at once, as the runtime does (so a consumer that
shows one frame per call is never more than a hop behind, as with a live session's clock; the call after an
interrupt hands out a fresh hop at once): a frame is a speech frame while
pushed audio remains (each takes 1/25 s of it), an idle frame otherwise; each frame carries its 1920 samples at
48 kHz (the pushed level while speaking, silence idle) and a 16x16 picture whose red level is the frame's index.
``interrupt`` drops the audio not yet made into frames. Frames carry segment numbers as the engine's do: a speech frame
its audio's segment, an idle frame the segment open when it was made (``end_segment`` closes one). ``max_lead``
seconds of audio may wait; more raises
``Backpressure`` as a live session does. Frames are due at once (``clock_anchor`` None): the integrations are
then driven as fast as their consumers take frames.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from engine.runtime import Backpressure, SessionClosed
from engine.runtime.session import Frame
from engine.timebase import FPS, HOP_FRAMES
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME

SIZE = 16


class FastSession:
    """Hop-sized batches of frames on demand; speech for exactly as long as the audio pushed."""

    audio_rate = AUDIO_RATE
    clock_anchor = None

    def __init__(self, max_lead: float = 5.0, frames_per_call: int = HOP_FRAMES) -> None:
        self.max_lead = max_lead
        self.frames_per_call = frames_per_call
        self.pending = 0.0
        self.pending_segments: list[list] = []
        """[segment, seconds] of the audio pending, oldest first."""
        self.segment = 0
        self.segment_has_audio = False
        self.pushed_seconds = 0.0
        self.next_index = 0
        self.interrupts = 0
        self.closed = False
        self._calls = 0
        self._lock = threading.Lock()

    def push_audio(self, pcm: np.ndarray, sample_rate: int, channels: int | None = None, block: bool = False) -> None:
        seconds = pcm.size / (channels or 1) / sample_rate
        with self._lock:
            if self.closed:
                raise SessionClosed("closed")
            if self.pending + seconds > self.max_lead:
                raise Backpressure(f"{self.pending:.2f} s waiting")
            self.pending += seconds
            self.pending_segments.append([self.segment, seconds])
            self.segment_has_audio = True
            self.pushed_seconds += seconds

    def take_ready(self) -> list[Frame]:
        with self._lock:
            if self.closed:
                raise SessionClosed("closed")
            frames = []
            self._calls += 1
            if (self._calls - 1) % self.frames_per_call:
                return frames
            for _ in range(self.frames_per_call):
                speech = self.pending > 1e-9
                segment = self.pending_segments[0][0] if speech else self.segment
                self._consume(1 / FPS)
                image = torch.zeros(SIZE, SIZE, 3, dtype=torch.uint8)
                image[..., 0] = self.next_index % 256
                image[..., 1] = 255 if speech else 0
                audio = np.full(AUDIO_SAMPLES_PER_FRAME, 0.25 if speech else 0.0, np.float32)
                frames.append(Frame(self.next_index, image, audio, speech, segment=segment))
                self.next_index += 1
            return frames

    def _consume(self, seconds: float) -> None:
        self.pending = max(self.pending - seconds, 0.0)
        while self.pending_segments and seconds > 1e-9:
            taken = min(seconds, self.pending_segments[0][1])
            self.pending_segments[0][1] -= taken
            seconds -= taken
            if self.pending_segments[0][1] <= 1e-9:
                self.pending_segments.pop(0)

    def end_segment(self) -> int | None:
        with self._lock:
            return self._close_segment()

    def interrupt(self) -> int | None:
        with self._lock:
            self.pending = 0.0
            self.pending_segments.clear()
            self.interrupts += 1
            self._calls = 0
            return self._close_segment()

    def _close_segment(self) -> int | None:
        if not self.segment_has_audio:
            return None
        closed, self.segment, self.segment_has_audio = self.segment, self.segment + 1, False
        return closed

    def close(self) -> None:
        self.closed = True


def portrait() -> np.ndarray:
    """The picture shown before the first frame: mid grey."""
    return np.full((SIZE, SIZE, 3), 128, np.uint8)

"""A synthetic live session for the streaming tests: the runtime's frame contract with no model behind it.

Frames are small RGB tensors whose top half spells the frame index in 16 black/white blocks
(readable after lossy coding) and whose bottom half flashes white once a second; the audio
is a quiet 440 Hz tone with a loud 1 kHz burst in exactly the flash frames, so a reader can
check A/V sync from what it decodes. ``lead`` seconds of frames are available ahead of the
session's own real-time clock (``clock_anchor``), as with the runtime.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from engine.controls import Controls
from engine.latency import FAITHFUL
from engine.runtime.session import Frame
from engine.timebase import FPS
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME

BITS = 16
FLASH_EVERY = FPS
TONE, BURST = 0.1, 0.8


def picture(index: int, width: int, height: int, flash: bool | None = None) -> torch.Tensor:
    """The frame image: index bits on top, a flash (every FLASH_EVERY frames, or as ``flash`` says) or a moving bar
    below."""
    image = torch.full((height, width, 3), 40, dtype=torch.uint8)
    block = width // (BITS // 2)
    for bit in range(BITS):
        row, col = divmod(bit, BITS // 2)
        if index >> bit & 1:
            image[row * height // 4 : (row + 1) * height // 4, col * block : (col + 1) * block] = 220
    bottom = image[height // 2 :]
    if index % FLASH_EVERY == 0 if flash is None else flash:
        bottom[:] = 255
    else:
        x = index * 8 % width
        bottom[:, x : x + width // 8, 1] = 200
    return image


def read_index(rgb: np.ndarray) -> int:
    """The frame index spelled in a decoded picture's top half."""
    height, width = rgb.shape[:2]
    block = width // (BITS // 2)
    luma = rgb.astype(np.float32).mean(axis=2)
    index = 0
    for bit in range(BITS):
        row, col = divmod(bit, BITS // 2)
        y, x = (2 * row + 1) * height // 8, col * block + block // 2
        if luma[y - 2 : y + 3, x - 2 : x + 3].mean() > 130:
            index |= 1 << bit
    return index


def is_flash(rgb: np.ndarray) -> bool:
    """Whether a decoded picture is a flash frame."""
    return rgb[3 * rgb.shape[0] // 4 :].mean() > 200


def sound(index: int) -> np.ndarray:
    """Frame ``index``'s 1920 samples: the tone, plus a burst in flash frames."""
    t = (np.arange(AUDIO_SAMPLES_PER_FRAME) + index * AUDIO_SAMPLES_PER_FRAME) / AUDIO_RATE
    audio = TONE * np.sin(2 * np.pi * 440 * t)
    if index % FLASH_EVERY == 0:
        audio = audio + BURST * np.sin(2 * np.pi * 1000 * t)
    return audio.astype(np.float32)


class SyntheticSession:
    """Live frames at 25 fps on the session's clock (``lead`` s ahead), until ``frames`` or ``end()``; records
    pushes."""

    def __init__(self, width: int = 256, height: int = 256, frames: int | None = None, lead: float = 0.2) -> None:
        self.width, self.height, self.lead = width, height, lead
        self.total = frames
        self.next_index = 0
        self.start: float | None = None
        self.pushed: list[tuple[np.ndarray, int, int | None]] = []
        self.interrupts = 0
        self.controls = Controls()
        self.latency = FAITHFUL
        self.ended = False
        self.closed = False
        self._lock = threading.Lock()

    @property
    def clock_anchor(self) -> float | None:
        """When its clock shows frame 0: the first ``next_frame`` call."""
        return self.start

    def next_frame(self, timeout: float | None = None) -> Frame | None:
        with self._lock:
            if self.total is not None and self.next_index >= self.total:
                return None
            if self.start is None:
                self.start = time.monotonic()
            index = self.next_index
            wait = self.start + index / FPS - self.lead - time.monotonic()
            if timeout is not None and wait > timeout:
                time.sleep(timeout)
                raise TimeoutError
            if wait > 0:
                time.sleep(wait)
            self.next_index += 1
        return Frame(index, picture(index, self.width, self.height), sound(index), speech=False)

    def push_audio(self, pcm: np.ndarray, sample_rate: int, channels: int | None = None, block: bool = False) -> None:
        if self.ended:
            raise RuntimeError("this session has ended")
        if not np.all(np.isfinite(pcm)):
            raise ValueError("PCM holds NaN/inf")
        self.pushed.append((pcm, sample_rate, channels))

    def update_controls(self, **changes) -> Controls:
        self.controls = self.controls.replace(**changes)
        return self.controls

    def interrupt(self) -> None:
        self.interrupts += 1

    def end(self) -> None:
        with self._lock:
            self.ended = True
            self.total = self.next_index + 5

    def close(self) -> None:
        self.closed = True
        self.end()

    def stats(self) -> dict[str, int | float]:
        return {"frames_generated": self.next_index, "frames_dropped": 0, "deadline_misses": 0, "hop_ms_p99": 1.5}

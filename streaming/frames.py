"""What streaming consumes and makes: the session's frames (index, RGB image on the device, 48 kHz audio), its clock,
and each output frame once encoded (``EncodedFrame``).

These are the serving runtime's contract (``engine.runtime.session``), restated as protocols so that
streaming depends only on the shape of a frame, never on how it was made: tests drive every
sink with a synthetic source, the server drives them with the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

import numpy as np
import torch

from engine.controls import Controls
from engine.latency import LatencyMode
from engine.runtime.config import RuntimeConfig
from engine.timebase import FPS

AUDIO_RATE = RuntimeConfig.audio_rate
"""The rate of the audio a frame carries (48 kHz, what the sinks encode), not the model's 16 kHz."""
AUDIO_SAMPLES_PER_FRAME = AUDIO_RATE // FPS
"""1920: the samples of a frame's own audio at ``AUDIO_RATE`` (the model hears
``engine.timebase.SAMPLES_PER_FRAME``)."""


class FrameLike(Protocol):
    """One output frame: ``image`` (H, W, 3) uint8 RGB on any device, ``audio`` the 1920 samples it speaks,
    ``ready`` the CUDA event after which the image is complete (None on the host), ``segment`` its speech segment."""

    index: int
    image: torch.Tensor
    audio: np.ndarray
    speech: bool
    ready: torch.cuda.Event | None
    segment: int

    @property
    def pts(self) -> Fraction: ...


class FrameSource(Protocol):
    """A live session seen from the output side: frames in order, ``None`` once it has ended and drained.

    ``clock_anchor``: monotonic time at which its clock shows frame 0 (None until it is known), so
    frame i is due at ``clock_anchor + i/25``; sinks pace by it.
    """

    @property
    def clock_anchor(self) -> float | None: ...

    def next_frame(self, timeout: float | None = None) -> FrameLike | None: ...

    def stats(self) -> dict[str, int | float]: ...


class AudioSink(Protocol):
    """A live session seen from the audio side (what sources push into)."""

    latency: LatencyMode

    def push_audio(
        self, pcm: np.ndarray, sample_rate: int, channels: int | None = None, block: bool = False
    ) -> None: ...

    def update_controls(self, /, **changes) -> Controls: ...

    def interrupt(self) -> int | None: ...

    def end_segment(self) -> int | None: ...

    def end(self) -> None: ...


def check_size(width: int, height: int) -> None:
    """ValueError unless both sides are positive and even (4:2:0 chroma halves them)."""
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"4:2:0 video needs a positive, even width and height, got {width}x{height}")


def check_image(image: torch.Tensor) -> tuple[int, int]:
    """(height, width) of an (H, W, 3) uint8 RGB tensor with even sides, else ValueError."""
    if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.ndim != 3 or image.shape[2] != 3:
        got = f"{tuple(image.shape)} {image.dtype}" if isinstance(image, torch.Tensor) else type(image).__name__
        raise ValueError(f"frames must be (H, W, 3) uint8 RGB torch tensors, got {got}")
    height, width = image.shape[:2]
    check_size(width, height)
    return height, width


@dataclass(frozen=True)
class EncodedFrame:
    """Output frame ``index`` (its slot) encoded: its H.264 access unit, its own audio (48 kHz float32) and that audio
    as Opus; ``repeat``: a stand-in for a frame that was not ready (the last picture again, silence); ``segment``: the
    speech segment of the session frame it shows (``engine.runtime.session``)."""

    index: int
    width: int
    height: int
    video: bytes
    keyframe: bool
    audio: np.ndarray
    opus: tuple[tuple[int, bytes], ...]
    speech: bool
    repeat: bool = False
    segment: int = 0
    picture: Any = None
    """The picture encoded (the encoder's input: a host I420 array for x264 and for the raw output)."""

    @property
    def pts(self) -> Fraction:
        """Seconds from the output's start, from the slot alone."""
        return Fraction(self.index, FPS)

"""The interface a session's motion comes through, whether sampled from its audio or computed beforehand.

``engine.motion_stream.MotionStream`` samples windows from streamed audio; ``engine.offline_motion.
PrecomputedMotion`` releases frames computed for a whole clip. A runtime session drives either one
the same way: commit audio, hand out HuBERT chunks and window requests, take the frames made final.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from engine.motion_stream import WindowRequest


class MotionSource(Protocol):
    """Model-rate audio in, final 265-d motion frames out; ``frames_out`` counts the frames returned so far."""

    samples_in: int
    frames_out: int
    ended: bool

    @property
    def anchor(self) -> torch.Tensor | None:
        """The relative-motion anchor d0 (265,), once known."""

    @property
    def audio_pending(self) -> bool:
        """Whether committed audio still waits for encoding."""

    @property
    def window_period(self) -> int | None:
        """New frames per window: the period a batching runtime keeps sessions in phase on (None: no windows)."""

    @property
    def held_frames(self) -> int:
        """Frames a window holds back for the next window's cross-fade."""

    @property
    def can_finish(self) -> bool:
        """Whether ``finish`` has frames to give now."""

    @property
    def finished(self) -> bool:
        """Whether every frame of an ended source has come out."""

    def push(self, samples: np.ndarray) -> None:
        """Commit model-rate mono float32 samples."""

    def end(self) -> None:
        """End of audio: what remains is released as it becomes final."""

    def interrupt(self) -> None:
        """Forget what no frame handed out depends on yet; what follows starts from there."""

    def samples_for_frames(self, total: int) -> int:
        """Samples still to commit before ``total`` frames in all can come out (0: none)."""

    def set_window_controls(self, fix_kp_cond: int, fix_kp_cond_dims: tuple[int, int] | None) -> None:
        """The window controls (see ``engine.diffusion.windows.kp_cond_frame``) for the windows requested next."""

    def take_chunks(self, limit: int) -> tuple[np.ndarray, int]:
        """Up to ``limit`` HuBERT chunks to encode, and how many of their features to keep."""

    def add_features(self, features: torch.Tensor) -> None:
        """The features (n,1024) of the chunks ``take_chunks`` handed out."""

    def window_request(self) -> WindowRequest | None:
        """The next window to sample, when one is due."""

    def complete(self, window: torch.Tensor) -> torch.Tensor:
        """The sampled window (80,265) of the last request -> the motion frames it made final."""

    def finish(self) -> torch.Tensor:
        """The frames that can come out without another window."""

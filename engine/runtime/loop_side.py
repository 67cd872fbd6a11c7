"""What the runtime's loop thread needs of a session, declared: the pipeline talks to a session through this
interface alone; ``Session`` implements it, and clients never call it."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.latency import LatencyMode
from engine.runtime.session import Frame, Intake


class SessionLoopSide(Protocol):
    """The loop's side of a session: what the loop takes from it (queued audio and commands, room in the frame queue,
    the frame last taken) and what it hands back (frames, committed audio, the clock, the speech latency, counts, the
    end or a failure)."""

    id: int
    live: bool
    audio_rate: int
    overlap: int
    seed: int
    latency: LatencyMode

    @property
    def last_taken(self) -> Frame | None:
        """The frame the client took last (None before the first)."""

    def collect(self) -> Intake:
        """Everything queued since the last call, in order: interrupt first, then audio, then end/close."""

    def deliver(self, frames: list[Frame], drop_oldest: bool, generation: int) -> None:
        """Queue rendered frames (unless an interrupt came since ``generation`` was collected)."""

    def room(self) -> int:
        """Frames the session's queue can still take."""

    def drain_resamplers(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The samples the resamplers still hold when no newer audio waits; None otherwise."""

    def set_committed(self, samples: int) -> None:
        """Model-rate samples committed to the motion stream so far."""

    def set_clock(self, anchor: float) -> None:
        """Start (or restart) the live clock: frame 0 is shown at ``anchor``."""

    def set_speech_latency(self, seconds: float) -> None:
        """How long after it is pushed speech is shown now."""

    def count(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to one of the session's counters."""

    def finish(self) -> None:
        """Every frame was delivered."""

    def fail(self, error: BaseException) -> None:
        """The session failed: its frames are dropped and its client's next call raises."""

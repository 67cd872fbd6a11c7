"""What a pipecat video service needs from whatever makes the avatar's frames: a runtime session in the same process
(``integrations.runtime_backend``) or a session of the live service (``integrations.service_backend``).

The pipecat-facing rules (the output clock, the held ``TTSStoppedFrame``, interruptions, errors) live once in
``integrations.pipecat_video``; a backend only opens, takes audio, interrupts, closes segments and hands out the
frame for each slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Refused(Exception):
    """The avatar's session could not be opened (admission, a bad request, an unreachable service): says why."""


@dataclass(frozen=True)
class Shown:
    """The frame one output slot shows: its index, RGB bytes, and for a speech frame the s16 mono audio it speaks."""

    index: int
    picture: bytes
    speech_audio: bytes | None


class AvatarBackend(Protocol):
    """A live avatar session as the pipecat service drives it; every method runs on the pipeline's event loop."""

    size: tuple[int, int] | None
    """Width and height of the pictures; None until the session is open where only the session knows it."""
    audio_rate: int
    """Sample rate of ``Shown.speech_audio``."""

    def first_picture(self) -> bytes | None:
        """What the slots show before the session's first frame (None: show nothing yet)."""

    async def open(self) -> None:
        """Open the session; raises ``Refused`` with the reason."""

    async def push_audio(self, pcm: bytes, sample_rate: int, channels: int, wanted: Callable[[], bool]) -> None:
        """Queue TTS audio (s16, interleaved), waiting while the session holds its lead; give up once ``wanted()`` is
        false (an interruption came meanwhile)."""

    def interrupt(self) -> None:
        """Drop pending speech and every frame held here."""

    async def end_segment(self) -> int | None:
        """Close the speech segment pushed since the last close: its number, or None when nothing was pushed."""

    def shown(self, segment: int) -> bool:
        """Whether every frame of ``segment`` has been shown (or dropped by an interruption)."""

    def next(self) -> Shown | None:
        """The frame for this slot, or None when none is due (the slot repeats the last picture)."""

    def phase(self) -> float | None:
        """Where the slot deadlines should fall (a monotonic time on their 1/25 s grid), or None: anywhere."""

    async def close(self) -> None:
        """End the session now."""

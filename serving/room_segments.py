"""The agent's speech segments as a room output keeps them (``serving.rooms``): each one's audio, the session's number
for it and what the agent was told (``Segment``), and the book shared by the output's three jobs (``SegmentBook``):
the segments not answered yet, the session's numbering, the speech frames shown of each and the cut.

``serving.room_speech`` opens, numbers, pushes and cuts segments; ``serving.room_frames`` counts the speech frames
released of each and shows idle in place of cut ones; ``serving.rooms`` tells the agent when each plays and ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from engine.timebase import FPS

log = logging.getLogger("serving.rooms")
NEVER = 1 << 62
"""A cut past every segment: no speech frame reaches the room."""


@dataclass
class Segment:
    """One agent speech segment (one byte stream): its audio, the session's number for it, what the agent was told.

    A pause cuts the session's speech; the resume pushes the segment's audio again from the position shown, as a new
    part (a new number on the session), so one agent segment may be spoken as several of the session's."""

    number: int | None = None
    """The session's number for its part now: set at the part's first push (the session's next number)."""
    audio: list[tuple[np.ndarray, int]] = field(default_factory=list)
    """Its audio as received (mono float32, rate): kept until it is answered, to resume from where a pause cut it."""
    shown_before: float = 0.0
    """Seconds of it shown in parts a pause cut."""
    ended: bool = False
    """Its stream has ended (its last part is closed, or will be at the resume)."""
    started: bool = False
    answered: bool = False

    def audio_from(self, seconds: float, start: int = 0) -> list[tuple[np.ndarray, int]]:
        """Its audio from ``seconds`` in, of the chunks from index ``start`` on (earlier ones counted, not returned)."""
        rest, elapsed = [], 0.0
        for index, (pcm, rate) in enumerate(self.audio):
            duration = pcm.size / rate
            if index >= start and elapsed + duration > seconds:
                rest.append((pcm[max(0, round((seconds - elapsed) * rate)) :], rate))
            elapsed += duration
        return rest


class SegmentBook:
    """The segments of one room output, and the session's numbers for them (on the rooms loop, but ``spoken`` and
    ``cut``, which the release thread writes and reads)."""

    def __init__(self) -> None:
        self.unanswered: list[Segment] = []
        """Agent segments not answered yet, oldest first."""
        self.by_number: dict[int, Segment] = {}
        """Segments by the session's number for their part now."""
        self.next_number = 0
        """The session's number for the next part pushed."""
        self.last_closed = -1
        self.spoken: dict[int, int] = {}
        """Speech frames released per session segment (written on the release thread)."""
        self.cut = -1
        """Speech frames of segments numbered up to this were cut by a clear: the room shows idle in their place."""

    def shown(self, segment: Segment) -> float:
        """Seconds of ``segment`` shown so far."""
        now = self.spoken.get(segment.number, 0) / FPS if segment.number is not None else 0.0
        return segment.shown_before + now

    def closed(self, number: int) -> None:
        """The session closed its segment ``number``: the next part pushed is numbered after it."""
        self.next_number, self.last_closed = number + 1, number

    def confirm(self, segment: Segment | None, number: int | None) -> None:
        """The session closed ``number`` (None: nothing was open) as ``segment``'s."""
        if number is None:
            if segment is not None and segment.number is not None:
                self.by_number.pop(segment.number, None)
                segment.number = None
            return
        if segment is not None and segment.number != number:
            log.warning("room output: the session numbered a segment %d, expected %s", number, segment.number)
            self.by_number.pop(segment.number, None)
            segment.number = number
            self.by_number[number] = segment
        self.closed(number)

    def forget_parts(self) -> None:
        """A pause cut every unfinished segment's part: each keeps the seconds shown, its number is forgotten."""
        for segment in self.unanswered:
            segment.shown_before = self.shown(segment)
            if segment.number is not None:
                self.by_number.pop(segment.number, None)
                self.spoken.pop(segment.number, None)
                segment.number = None

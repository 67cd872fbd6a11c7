"""Which runtime frame an integration shows in its next 1/25 s output slot.

Both integrations (pipecat, LiveKit) emit one picture per slot. A live session's frames come in hop batches,
ready a little ahead of the session's own clock; on a CPU or an overloaded GPU they come late. ``SlotPicker``
hands out the oldest frame once this slot is the nearest to its due time on the session's clock (the output
clock's rule, ``streaming.slots.fill``; a late frame at once), or None when there is
none yet (the integration repeats its last picture), and holds at most ``max_held`` frames.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

from engine.timebase import FPS
from streaming.slots import Fill, fill


class Indexed(Protocol):
    """A frame as the picker sees it: its index on the session's clock."""

    index: int


class SlotPicker:
    """The next frame to show from a session (anything with ``take_ready()`` and ``clock_anchor``), bounded: a runtime
    session, or the frames a remote bot receives from the service."""

    def __init__(self, session, max_held: int = 25) -> None:
        self.session = session
        self.max_held = max_held
        self.dropped = 0
        self._held: deque[Indexed] = deque()

    def next(self) -> Indexed | None:
        """The frame for this slot, or None when none is due; raises ``SessionClosed`` when the session failed."""
        self._held.extend(self.session.take_ready())
        while len(self._held) > self.max_held:
            self._held.popleft()
            self.dropped += 1
        if not self._held:
            return None
        anchor = self.session.clock_anchor
        if anchor is not None and fill(time.monotonic(), anchor + self._held[0].index / FPS) is Fill.REPEAT:
            return None
        return self._held.popleft()

    def clear(self) -> int:
        """Drop every frame held here (an interruption); returns how many."""
        dropped = len(self._held)
        self._held.clear()
        self.dropped += dropped
        return dropped

    @property
    def held(self) -> int:
        """Frames taken from the session and not yet shown."""
        return len(self._held)

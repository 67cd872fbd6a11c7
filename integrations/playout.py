"""When a remote bot shows each picture of the service's stream: on a line locked to the stream's own clock.

The service releases one picture per 1/25 s slot of its clock. Picture ``s`` is ready in the bot once it and its audio
have arrived, after a delay that is least at the least-loaded moments and longer at the rest (jitter buffers,
decoders, a busy machine). The bot shows it at ``origin + s / 25``: ``origin`` is the least delay over the last
``WINDOW_S`` (the service's clock as the bot receives it, so a drift between the two machines' clocks is followed)
plus a ``margin`` that covers most delays above the least. The bot's own slot deadlines are put on that line
(``origin`` is their phase), so a picture waits there about the margin, however the bot's clock started: every bot of
a service then shows a picture as late as its own stream makes it, not as late as its start happened to be.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from streaming.slots import EPSILON, PERIOD

WINDOW_S = 10.0
"""Seconds of arrivals the least delay and the margin are taken over."""
MIN_MARGIN_S = 0.004
"""The least margin: the event loop's own wake-up jitter."""
MAX_MARGIN_S = 0.030
"""The most margin: past it a late picture is shown a slot later instead (a repeat) rather than every one later."""
MARGIN_QUANTILE = 0.995
"""The share of delays above the least that the margin covers."""
MARGIN_EVERY_S = 1.0
"""How often the margin is taken again."""


class Playout:
    """The line pictures are shown on: fed each picture's ready time, it says which slot a deadline shows."""

    def __init__(self) -> None:
        self._least: deque[tuple[float, float]] = deque()
        """(ready time, delay) with increasing delays: the front is the least delay in the window."""
        self._delays: deque[tuple[float, float]] = deque()
        self._margin = MIN_MARGIN_S
        self._margin_at = -math.inf

    def ready(self, slot: int, at: float) -> None:
        """Picture ``slot`` (its stream timestamp, 1/25 s) and its audio are here since ``at`` (monotonic seconds)."""
        delay = at - slot * PERIOD
        while self._least and self._least[-1][1] >= delay:
            self._least.pop()
        self._least.append((at, delay))
        self._delays.append((at, delay))
        for kept in (self._least, self._delays):
            while len(kept) > 1 and kept[0][0] < at - WINDOW_S:
                kept.popleft()
        if at - self._margin_at >= MARGIN_EVERY_S:
            least = self._least[0][1]
            spread = np.quantile(np.fromiter((d for _, d in self._delays), float), MARGIN_QUANTILE) - least
            self._margin = min(max(float(spread), MIN_MARGIN_S), MAX_MARGIN_S)
            self._margin_at = at

    @property
    def origin(self) -> float | None:
        """When slot 0 is shown (monotonic seconds; slot ``s`` a ``PERIOD`` per slot later); None before any
        picture was ready."""
        return self._least[0][1] + self._margin if self._least else None

    @property
    def margin(self) -> float:
        """Seconds a picture is shown after the least delay."""
        return self._margin

    def slot_at(self, deadline: float) -> int | None:
        """The slot whose time on the line is nearest ``deadline``; None before any picture was ready."""
        origin = self.origin
        return None if origin is None else math.floor((deadline - origin) / PERIOD + 0.5 + EPSILON)

"""Pacing by presentation time against one wall-clock anchor: absolute deadlines, so waits never add up to drift."""

from __future__ import annotations

import time


class Pacer:
    """Deadline of pts p is ``anchor + p`` on the monotonic clock.

    With a source clock (``source``: when the source shows pts 0, e.g. the runtime's live clock)
    the anchor is that clock plus ``delay``, the time allowed for encoding after a frame's
    deadline, and follows it when the source re-anchors; a second clock of our own would only add
    latency. Without one, the first item sets the anchor ``delay`` after it arrived (a playout
    buffer that absorbs jitter in how frames arrive). An item more than ``resync_after`` seconds
    late re-anchors the clock (counted in ``resyncs``) instead of bursting everything that is behind.
    """

    def __init__(self, delay: float = 0.1, resync_after: float = 0.5) -> None:
        self.delay, self.resync_after = delay, resync_after
        self.anchor: float | None = None
        self.resyncs = 0
        self._source: float | None = None

    def deadline(self, pts: float, now: float | None = None, source: float | None = None) -> float:
        """Monotonic time at which the item with this pts (seconds) is due."""
        now = time.monotonic() if now is None else now
        if source is not None and source != self._source:
            self._source = source
            self.anchor = source + self.delay
        if self.anchor is None:
            self.anchor = now + self.delay - pts
        due = self.anchor + pts
        if now - due > self.resync_after:
            self.anchor = now + self.delay - pts
            self.resyncs += 1
            due = self.anchor + pts
        return due

    def wait(self, pts: float, source: float | None = None) -> float:
        """Sleep until the item is due; returns how late it was (seconds, 0 when on time)."""
        now = time.monotonic()
        due = self.deadline(pts, now, source)
        if due > now:
            time.sleep(due - now)
            return 0.0
        return now - due

"""Playback events: when each speech segment starts and stops being shown, from the frames the output clock releases.

A sink of the session's output (``streaming.output``), so "shown" means released at its slot:
``playback_started`` at the first speech frame of a segment, ``playback_finished`` with the
seconds of its speech shown (``position``) and whether it was ``interrupted``, at the first frame
numbered above it. Segment numbers never go back along a stream and every number below one seen
is a segment that was pushed (``engine.runtime.session``), so each gets exactly one ``playback_finished``,
also one interrupted before any of its frames was shown (position 0, no ``playback_started``). How
each segment was closed comes from the engine core (``closed``) ahead of any frame numbered above
it; when the stream ends, what is left is finished, as interrupted unless it had been closed by its
end. Events not taken by ``emit`` (a full queue) are kept and offered again at the next frame.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.timebase import FPS
from streaming.output import EncodedFrame
from streaming.push_messages import PlaybackFinished, PlaybackStarted


class PlaybackEvents:
    """Turn released frames into ``playback_started`` / ``playback_finished`` events for ``emit`` (False: not taken)."""

    name = "playback"

    def __init__(self, emit: Callable[[PlaybackStarted | PlaybackFinished], bool]) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self._next = 0
        """The lowest segment not finished yet."""
        self._started: int | None = None
        self._spoken = 0
        self._closed: dict[int, bool] = {}
        self._outbox: list[PlaybackStarted | PlaybackFinished] = []
        self.started = 0
        self.finished = 0

    def closed(self, segments: list[tuple[int, bool]]) -> None:
        """The core closed these (segment, interrupted); called before any frame numbered above them is released."""
        with self._lock:
            for segment, interrupted in segments:
                if segment >= self._next:
                    self._closed[segment] = interrupted

    def send(self, frame: EncodedFrame) -> None:
        """One released frame (repeats are stand-ins and say nothing about the speech)."""
        if frame.repeat:
            with self._lock:
                self._flush()
        else:
            self.shown(frame.speech, frame.segment)

    def shown(self, speech: bool, segment: int) -> None:
        """A frame of the session is shown now: whether it speaks, and its segment (what ``send`` takes of a released
        frame; an integration that shows the session's frames itself calls this)."""
        with self._lock:
            self._finish_below(segment)
            if speech and segment >= self._next:
                if self._started != segment:
                    self._started, self._spoken = segment, 0
                    self._outbox.append(PlaybackStarted(segment))
                    self.started += 1
                self._spoken += 1
            self._flush()

    def close(self) -> None:
        """The stream ended: finish every segment known and not finished (interrupted unless closed by its end)."""
        with self._lock:
            known = [*self._closed, *([] if self._started is None else [self._started])]
            if known:
                self._finish_below(max(known) + 1)
            self._flush()

    def stats(self) -> dict[str, int]:
        return {
            "segments_started": self.started,
            "segments_finished": self.finished,
            "events_waiting": len(self._outbox),
        }

    def _finish_below(self, segment: int) -> None:
        while self._next < segment:
            done = self._next
            position = self._spoken / FPS if self._started == done else 0.0
            interrupted = self._closed.pop(done, True)
            self._outbox.append(PlaybackFinished(done, position, interrupted))
            self.finished += 1
            self._next += 1

    def _flush(self) -> None:
        while self._outbox and self._emit(self._outbox[0]):
            self._outbox.pop(0)

"""The sinks of one session output (``streaming.output.SessionOutput``) and the frames fanned out to them: which sinks
are attached (added and removed at any time, from any thread), each released frame handed to each in turn, and a sink
that fails (``SinkFailed``, or any other exception from ``send`` or ``close``) detached, closed and reported, while the
others carry on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from streaming.frames import EncodedFrame

log = logging.getLogger("streaming.output")


class SinkFailed(Exception):
    """A sink can no longer deliver (its file cannot be written, its server gave up): raised from ``send`` or
    ``close``, the output detaches and closes it and reports the message (``SessionOutput``'s ``on_sink_failed``)."""


class Sink(Protocol):
    """Something that takes encoded frames at their release time; ``send`` must never block."""

    name: str

    def send(self, frame: EncodedFrame) -> None: ...

    def close(self) -> None: ...

    def stats(self) -> dict[str, int | float]: ...


class Fanout:
    """The sinks of output ``name``; ``on_sink_failed(sink name, message)`` is told of each that failed, from the
    thread that sent to it or closed it."""

    def __init__(self, name: str, on_sink_failed: Callable[[str, str], None] | None = None) -> None:
        self.name = name
        self._on_sink_failed = on_sink_failed
        self._sinks: tuple[Sink, ...] = ()
        self._lock = threading.Lock()

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks now attached."""
        return self._sinks

    def add(self, sink: Sink) -> None:
        """Attach a sink; it receives frames from the next ``send`` on."""
        with self._lock:
            self._sinks = (*self._sinks, sink)

    def remove(self, sink: Sink) -> None:
        """Detach a sink (it is not closed)."""
        with self._lock:
            self._sinks = tuple(s for s in self._sinks if s is not sink)

    def send(self, frame: EncodedFrame) -> None:
        """Hand ``frame`` to every sink; one that raises is detached, reported and closed."""
        for sink in self._sinks:
            try:
                sink.send(frame)
            except Exception as exc:
                self.remove(sink)
                self._failed(sink, exc)
                self._close(sink)

    def close_all(self) -> None:
        """Close every sink attached (the output has ended)."""
        for sink in self._sinks:
            self._close(sink)

    def _close(self, sink: Sink) -> None:
        try:
            sink.close()
        except Exception as exc:
            self._failed(sink, exc)

    def _failed(self, sink: Sink, exc: Exception) -> None:
        """Log a sink's failure and report it (a SinkFailed says why; anything else is a fault of the sink)."""
        if isinstance(exc, SinkFailed):
            log.error("output %s: sink %s failed: %s", self.name, sink.name, exc)
            message = str(exc)
        else:
            log.error("output %s: sink %s failed", self.name, sink.name, exc_info=exc)
            message = f"the {sink.name} output failed ({type(exc).__name__})"
        if self._on_sink_failed is not None:
            self._on_sink_failed(sink.name, message)

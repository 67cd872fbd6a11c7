"""A live session's events from its output worker and the engine core, published where they belong: playback events
to its push sockets, encoded packets to its WebRTC preview, its room's join to the request waiting for it, failures
and its end to its state; and its worker's counters, which mark it degraded or behind real time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from serving.api import SessionState
from serving.protocol import (
    Event,
    OutputFailed,
    OutputsClosed,
    Playback,
    PreviewEnded,
    PreviewPacket,
    RoomJoined,
    SessionEnded,
)
from serving.sessions import ServedSession
from streaming import push_messages as push
from streaming.output import SILENCE, EncodedFrame

log = logging.getLogger("serving.service")
DEGRADED_SHARE = 0.1
"""More than this share of a session's output slots repeated since its worker's last report marks it degraded."""
BEHIND_SECONDS = 5.0
"""A session whose newest frame is further than this behind its live clock is logged once as behind real time."""


class SessionEvents:
    """Publishes each live session's events; ``end`` ends a session that has nothing left to do, ``close`` asks the
    core to close one whose outputs closed on their own, ``closed`` is told once a session's outputs have closed."""

    def __init__(
        self,
        device: str,
        end: Callable[[ServedSession], None],
        close: Callable[[str], None],
        closed: Callable[[ServedSession], None],
    ) -> None:
        self._device = "the CPU" if device == "cpu" else "the GPU"
        self._end, self._close, self._closed = end, close, closed

    def event(self, session: ServedSession, message: Event) -> None:
        """One event of ``session``."""
        match message:
            case PreviewPacket() if session.preview is not None:
                session.preview.send(preview_frame(message))
            case Playback(event=event, fields=fields):
                session.audio.playback(push.playback_event(event, fields))
            case PreviewEnded() if session.preview is not None:
                asyncio.ensure_future(session.preview.aclose())
            case SessionEnded(error=error, stats=stats):
                session.core_stats = stats or session.core_stats
                if error is not None and session.state != SessionState.ENDING:
                    session.state, session.error = SessionState.FAILED, error
            case RoomJoined() if session.joined is not None and not session.joined.done():
                session.joined.set_result(message)
            case OutputFailed(sink="livekit", message=text) if session.live:
                log.info("session %s: %s; ending it", session.id, text)  # the room was its audio: nothing left to do
                session.error = f"livekit: {text}"
                self._end(session)
            case OutputFailed(sink=sink, message=text):
                log.error("session %s: its %s output failed: %s", session.id, sink, text)
                session.error = f"{sink}: {text}"
                session.audio.playback(push.OutputFailed(sink, text))
            case OutputsClosed(stats=stats):
                session.output_stats = stats or session.output_stats
                if session.state == SessionState.LIVE:  # its outputs closed on their own (a ring it could not attach)
                    self._close(session.id)
                if session.state != SessionState.FAILED:
                    session.state = SessionState.ENDED
                session.closed.set()
                self._closed(session)

    def counters(self, session: ServedSession, stats: dict[str, Any]) -> None:
        """Take a worker's counters; mark (and log, once) a session whose output has shed more than DEGRADED_SHARE of
        its slots since the last report, and tell its clients when it falls behind real time and when it keeps up
        again. The policy is to degrade, not to end it: the client decides."""
        before = session.output_stats
        slots = stats.get("frames_released", 0) - before.get("frames_released", 0)
        repeats = stats.get("repeated", 0) - before.get("repeated", 0)
        session.output_stats = stats
        seconds = stats.get("behind_seconds")
        behind = seconds is not None and seconds > BEHIND_SECONDS
        if behind and not session.behind:
            log.warning(
                "session %s is %.0f s behind real time: %s renders slower than real time, so what is pushed now is "
                "shown that much later",
                session.id,
                seconds,
                self._device,
            )
            session.audio.playback(push.BehindRealTime(seconds))
        elif session.behind and not behind and seconds is not None:
            log.info("session %s is back within %.0f s of real time", session.id, BEHIND_SECONDS)
            session.audio.playback(push.KeepsUp(seconds))
        session.behind = behind
        degraded = slots > 0 and repeats > DEGRADED_SHARE * slots
        if degraded != session.degraded:
            session.degraded = degraded
            if degraded:
                log.warning(
                    "session %s is shedding: %d of its last %d frames were repeats (its frames are not ready in time: "
                    "more sessions than %s serves)",
                    session.id,
                    repeats,
                    slots,
                    self._device,
                )
            else:
                log.info("session %s keeps up again", session.id)


def preview_frame(packet: PreviewPacket) -> EncodedFrame:
    """A worker's encoded preview packet as the frame the WebRTC preview sends."""
    return EncodedFrame(
        packet.index,
        packet.width,
        packet.height,
        packet.video,
        packet.keyframe,
        SILENCE,
        packet.opus,
        packet.speech,
        packet.repeat,
        packet.segment,
    )

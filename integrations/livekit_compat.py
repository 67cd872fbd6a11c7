"""What differs between the livekit-agents releases the LiveKit integration works with (1.8, 2.0.0b1), in one place.

- The agent's session class: ``AgentSession`` in 1.8, ``LiveSession`` in 2.0 (where ``AgentSession`` is a deprecated
  alias that warns): ``LiveSession`` here is whichever the release has.
- The agent's side of an interruption (``DataStreamAudioOutput.clear_buffer``). 1.8.9 sends ``lk.clear_buffer`` only
  while a segment awaits its ``playback_finished`` and one clear at a time, makes the next segment's audio wait until
  the clear is answered, and after ``clear_buffer_timeout`` finishes only the segments still unanswered. 2.0.0b1 (cut
  from an older 1.x) sends every clear, lets the next segment's byte stream go out before the clear, and arms a timer
  per clear that, unless a ``playback_finished`` comes after it, finishes whatever segment is then playing, also the
  next reply, and resets the output's counts. ``DataStreamOutput`` is the release's own output where it has 1.8.9's
  rules, else ``ClearsInTurn``, which brings them.

The output's private state that ``ClearsInTurn`` reads, and the protocol's RPC names (re-exported here), come from
``streaming.sinks.livekit_avatar_io``, the one module that touches livekit-agents' private names.
"""

from __future__ import annotations

import asyncio
import logging

from livekit import rtc
from livekit.agents import __version__ as AGENTS_VERSION
from livekit.agents import voice
from livekit.agents.voice.avatar import DataStreamAudioOutput

from streaming.sinks.livekit_avatar_io import (
    CLEARS_IN_TURN,
    RPC_CLEAR_BUFFER,
    RPC_PLAYBACK_FINISHED,
    RPC_PLAYBACK_STARTED,
    clear_buffer_timeout,
    keep_task,
    output_room,
    output_started,
    pending_playback_count,
    pushed_duration,
)

__all__ = [
    "AGENTS_VERSION",
    "RPC_CLEAR_BUFFER",
    "RPC_PLAYBACK_FINISHED",
    "RPC_PLAYBACK_STARTED",
    "ClearsInTurn",
    "DataStreamOutput",
    "LiveSession",
]

log = logging.getLogger(__name__)

LiveSession = getattr(voice, "LiveSession", None) or voice.AgentSession
"""The agent's session (``AgentSession`` in livekit-agents 1.8, ``LiveSession`` from 2.0)."""


class ClearsInTurn(DataStreamAudioOutput):
    """``DataStreamAudioOutput`` with livekit-agents 1.8.9's clear rules, for a release without them: a clear only while
    a segment is unanswered, one at a time; audio captured meanwhile waits for its answer (so a reply's byte stream
    never reaches the avatar before the clear that precedes it); past ``clear_buffer_timeout`` only the segments still
    unanswered are finished."""

    def __init__(self, room: rtc.Room, **options: object) -> None:
        super().__init__(room, **options)
        self._clearing: asyncio.Task[None] | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        while self._clearing is not None and not self._clearing.done():
            await asyncio.shield(self._clearing)
        await super().capture_frame(frame)

    def clear_buffer(self) -> None:
        if not output_started(self) or not pending_playback_count(self):
            return
        if self._clearing is not None and not self._clearing.done():
            return
        clearing = asyncio.ensure_future(self._clear(pushed_duration(self), self.captured_playout_segments))
        if clear_buffer_timeout(self) is not None:
            self._clearing = clearing
        keep_task(self, clearing)

    async def _clear(self, pushed: float, captured: int) -> None:
        timeout = clear_buffer_timeout(self)
        room, avatar = output_room(self)
        try:
            await room.local_participant.perform_rpc(destination_identity=avatar, method=RPC_CLEAR_BUFFER, payload="")
        except Exception as exc:
            log.error("the avatar did not take lk.clear_buffer: %s", exc)
            timeout = 0  # nothing will answer: the segments are done now
        if timeout is None or not pending_playback_count(self):
            return
        try:
            await asyncio.wait_for(self.wait_for_playout(), timeout)
        except TimeoutError:
            log.warning("no playback_finished %.1f s after lk.clear_buffer: marking the playback done", timeout)
            answered = self.captured_playout_segments - pending_playback_count(self)
            for _ in range(captured - answered):
                self.on_playback_finished(playback_position=pushed, interrupted=True)


DataStreamOutput: type[DataStreamAudioOutput] = DataStreamAudioOutput if CLEARS_IN_TURN else ClearsInTurn
"""The agent's data-stream audio output to a remote avatar, with 1.8.9's clear rules in every release."""

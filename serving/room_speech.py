"""A room output's speech in: the agent's TTS audio into the session, segment by segment, and the agent's clear, pause
and resume applied to it (on the rooms loop).

Each agent segment (one ``lk.audio_stream`` byte stream, or one segment of an in-process ``QueueAudioOutput``) is
decoded as the push WebSocket decodes PCM and pushed into the session (``SessionAudio``: the engine core's
backpressure slows the receiver, never drops audio); its end closes the session's segment. Every request to the
session is made under one lock, in order, so an interrupt never overtakes the push or the close before it. A clear
answers every unfinished segment at once (through ``answer``, the room output's) and interrupts the session; a pause
interrupts it too but keeps each segment's audio from the position shown, and the resume pushes it again from there.
The segments, their numbers and the cut live in the output's ``SegmentBook`` (``serving.room_segments``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import numpy as np
from livekit import rtc
from livekit.agents.voice.avatar import AudioReceiver, AudioSegmentEnd, QueueAudioOutput

from serving.api import SessionError
from serving.room_segments import NEVER, Segment, SegmentBook
from streaming.sinks.livekit_avatar_io import RoomAudioReceiver, pending_playback_count
from streaming.sources.push import ProtocolError, PushFormat, decode_chunk

log = logging.getLogger("serving.rooms")


class SessionAudio(Protocol):
    """A session's audio side, awaited (``serving.sessions.RemoteSession``)."""

    async def push_audio(self, pcm: Any, sample_rate: int) -> None: ...

    async def end_segment(self) -> int | None: ...

    async def interrupt(self) -> int | None: ...


class AgentSpeech:
    """The agent's speech into one session: ``receive`` takes it from ``receiver`` (set first); ``clear``, ``pause``
    and ``resume`` are the agent's. ``answer(segment, position, interrupted)`` tells the agent a segment is finished;
    ``spawn`` runs a coroutine as a task of the room output (cancelled when it closes)."""

    def __init__(
        self,
        audio: SessionAudio,
        book: SegmentBook,
        answer: Callable[[Segment, float, bool], None],
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
        counters: dict[str, int],
    ) -> None:
        self.audio, self.book, self._answer, self._spawn, self.counters = audio, book, answer, spawn, counters
        self.receiver: AudioReceiver | None = None
        self._open: Segment | None = None
        self._opened = 0
        """Agent segments begun here (their first frame read), and those answered unread at a clear."""
        self._paused = False
        """The agent paused its speech (a possible false interruption): audio is kept, none reaches the session."""
        self._holding = False
        """Paused, or pushing again what a pause cut: new audio waits in its segment."""
        self._held: asyncio.Task | None = None
        self._turn = 0
        """Counts clears: a resume's replay stops at the next one (what follows a clear is new speech)."""
        self._session_lock = asyncio.Lock()
        """Held around each request to the session, so an interrupt never overtakes the push or close before it."""
        self._pushing: asyncio.Task | None = None

    # -- the agent's audio ------------------------------------------------------------------------------------------

    async def receive(self) -> None:
        """The agent's audio from ``receiver`` into the session, segment by segment (the receiver waits for the agent
        to join)."""
        receiver = self.receiver
        try:
            await receiver.start()
            async for item in receiver:
                if isinstance(item, AudioSegmentEnd):
                    await self._end_segment()
                else:
                    await self._push(item)
        except SessionError as exc:
            log.info("room output: the session no longer takes audio: %s", exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("room output: taking the agent's audio failed")

    async def _push(self, frame: rtc.AudioFrame) -> None:
        if self._open is None:
            self._open = Segment()
            self.book.unanswered.append(self._open)
            self._opened += 1
            self.counters["segments"] += 1
        segment = self._open
        try:
            pcm = decode_chunk(bytes(frame.data), PushFormat(frame.sample_rate, frame.num_channels, "s16le"))
        except ProtocolError as exc:
            log.warning("room output: dropped a frame of the agent's audio: %s", exc)
            return
        segment.audio.append((pcm, frame.sample_rate))
        if not self._holding:
            await self._send_audio(segment, pcm, frame.sample_rate)

    async def _send_audio(self, segment: Segment, pcm: np.ndarray, rate: int) -> None:
        """Push ``segment``'s audio into the session, in order with every other request (a clear or a pause that
        comes meanwhile cancels it)."""
        async with self._session_lock:
            if segment.answered or self._paused:  # cleared or paused while this waited
                return
            if segment.number is None:
                segment.number = self.book.next_number
                self.book.by_number[segment.number] = segment
            self._pushing = asyncio.ensure_future(self.audio.push_audio(pcm, rate))
            await asyncio.wait([self._pushing])
            pushing, self._pushing = self._pushing, None
            if pushing.cancelled():
                return
            try:
                pushing.result()
            except SessionError as exc:
                if exc.kind != "invalid":
                    raise
                log.warning("room output: the session refused a frame of the agent's audio: %s", exc)

    async def _end_segment(self) -> None:
        """The agent's stream ended: close the session's segment (a stream cleared or without audio has none open;
        while paused it is closed at the resume)."""
        segment, self._open = self._open, None
        if segment is None:
            return
        segment.ended = True
        if not self._holding:
            await self._close(segment)

    async def _close(self, segment: Segment) -> None:
        async with self._session_lock:
            number = await self.audio.end_segment()
        self.book.confirm(segment, number)
        if number is None:
            self._answer(segment, segment.shown_before, interrupted=False)

    # -- the agent's clear, pause and resume ------------------------------------------------------------------------

    def clear(self) -> None:
        """``lk.clear_buffer``: answer every unfinished segment now, then cut the session's speech."""
        self.counters["clears"] += 1
        self.book.cut = NEVER  # no speech frame reaches the room until the session has been interrupted
        self._paused = self._holding = False  # a clear ends a pause: what follows is new speech
        self._turn += 1
        held = self._held_segments()
        for segment in list(self.book.unanswered):
            self._answer(segment, self.book.shown(segment), interrupted=True)
        for _ in range(held):  # segments whose every frame the receiver dropped before this output read one
            self.book.unanswered.append(Segment())
            self._answer(self.book.unanswered[-1], 0.0, interrupted=True)
        self._opened += held
        cleared, self._open = self._open, None
        if self._pushing is not None:
            self._pushing.cancel()
        self._spawn(self._interrupt(cleared))

    def _held_segments(self) -> int:
        """Segments the agent sent whose every frame the receiver held unread and dropped at this clear: the agent
        waits for their ``playback_finished`` too. Its audio output's own count tells when it is in this process
        (``QueueAudioOutput``); over a room, the byte streams the receiver took against the segments read here."""
        receiver = self.receiver
        if isinstance(receiver, QueueAudioOutput):
            return max(0, pending_playback_count(receiver) - len(self.book.unanswered))
        if isinstance(receiver, RoomAudioReceiver):
            return max(0, receiver.streams_taken() - self._opened)
        return 0

    async def _interrupt_session(self, doing: str) -> int | None:
        """Interrupt the session (for the agent's ``doing``, interrupt or pause); the segment it cut, None when none
        was open or the session refused (logged)."""
        try:
            return await self.audio.interrupt()
        except SessionError as exc:
            log.info("room output: could not %s the session: %s", doing, exc)
            return None

    async def _interrupt(self, cleared: Segment | None) -> None:
        async with self._session_lock:
            number = await self._interrupt_session("interrupt")
            self.book.confirm(cleared, number)
            self.book.cut = self.book.last_closed

    def pause(self) -> None:
        """The agent paused its speech: cut the session's speech now (the avatar idles), keep the audio to resume."""
        if self._paused:
            return
        self.counters["pauses"] += 1
        self._paused = self._holding = True
        self.book.cut = NEVER
        if self._pushing is not None:
            self._pushing.cancel()
        self._held = self._spawn(self._hold())

    async def _hold(self) -> None:
        """Interrupt the session; each unfinished segment keeps the seconds shown, its cut part forgotten."""
        async with self._session_lock:
            number = await self._interrupt_session("pause")
            if number is not None:
                self.book.closed(number)
            self.book.forget_parts()
            self.book.cut = self.book.last_closed

    def resume(self) -> None:
        """The pause was a false alarm: speak each unfinished segment on from where it was cut."""
        if not self._paused:
            return
        self._paused = False
        self._spawn(self._replay(self._held, self._turn))

    async def _replay(self, held: asyncio.Task, turn: int) -> None:
        """Push each unfinished segment's audio again from the position shown (and what came meanwhile), closing
        those whose stream ended; then new audio flows again. A clear or another pause stops it."""
        await asyncio.wait([held])
        replayed: set[int] = set()
        while not self._paused and self._turn == turn:
            waiting = [segment for segment in self.book.unanswered if id(segment) not in replayed]
            if not waiting:
                self._holding = False  # no await since the last look: nothing can slip in between
                return
            segment = waiting[0]
            chunks, pushed = segment.audio_from(segment.shown_before), len(segment.audio)
            while chunks and not self._paused and self._turn == turn:
                for pcm, rate in chunks:
                    await self._send_audio(segment, pcm, rate)
                chunks, pushed = segment.audio[pushed:], len(segment.audio)
            if segment.ended and not segment.answered and not self._paused and self._turn == turn:
                await self._close(segment)
            replayed.add(id(segment))

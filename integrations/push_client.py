"""A client of a session's push WebSocket (docs/push.md): TTS audio, interrupts and segment ends out, answers and
playback events in.

Audio is taken at once (``send_audio`` returns without waiting, up to ``MAX_QUEUED_S`` held here) and sent in order by
one task, at most ``LEAD_S`` ahead of wall time: within what the service takes ahead of real time (its session's lead
and its push connection's queue, ``streaming.sources.push``), so the service always reads the socket and an interrupt
is never stuck behind audio in TCP buffers. A TTS may so pre-fill seconds of speech without blocking its pipeline;
one faster still waits in ``send_audio`` once this client holds ``MAX_QUEUED_S``. An interrupt drops what is held here
and goes out at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from streaming.push_messages import (
    AheadLimit,
    EndOfSegment,
    Error,
    Format,
    Interrupt,
    Interrupted,
    PlaybackFinished,
    PushMessageError,
    SegmentEnded,
    ServerMessage,
    server_message,
)

LEAD_S = 10.0
"""Seconds of audio on the socket ahead of wall time at most (the service takes 5 in the session and 10 more)."""
MAX_QUEUED_S = 20.0
"""Seconds of audio held here, not yet on the socket, before ``send_audio`` waits."""
ANSWER_TIMEOUT_S = 5.0

log = logging.getLogger(__name__)


@dataclass
class _Audio:
    pcm: bytes
    sample_rate: int
    channels: int
    wanted: Callable[[], bool]

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / self.channels / self.sample_rate


class PushClient:
    """One push connection: the audio and segment ends it sends in order, and what the service answers."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._format: tuple[int, int] | None = None
        self._sent_until = 0.0
        self._queue: deque[_Audio | asyncio.Future] = deque()
        """Audio to send and, in order among it, the futures of segment ends (answered with the segment's number)."""
        self._queued_s = 0.0
        self._changed = asyncio.Event()
        self._segment_answers: deque[asyncio.Future] = deque()
        self.highest_segment = -1
        """The highest segment number the service has named so far."""
        self.cut_through = -1
        """Every segment up to this one was cut by an answered interrupt."""
        self.last_finished: PlaybackFinished | None = None
        """The last ``playback_finished`` event as it arrived (its ``position``: the seconds of speech shown)."""
        self.interrupts_answered = 0
        self.held_back: AheadLimit | None = None
        """The service's last ``ahead_limit`` event: this client pushed past what it takes ahead of real time."""
        self._reader = asyncio.ensure_future(self._read())
        self._sender = asyncio.ensure_future(self._send())

    @classmethod
    async def connect(cls, http: aiohttp.ClientSession, url: str) -> PushClient:
        """Open the push socket at ``url`` (the session's ``urls.push``, token included)."""
        return cls(await http.ws_connect(url, heartbeat=10.0))

    @property
    def queued_seconds(self) -> float:
        """Audio taken and not yet on the socket."""
        return self._queued_s

    async def send_audio(self, pcm: bytes, sample_rate: int, channels: int, wanted: Callable[[], bool]) -> None:
        """Queue s16 PCM for the socket (sent unless ``wanted()`` has turned false by then); waits only while this
        client already holds ``MAX_QUEUED_S``."""
        audio = _Audio(pcm, sample_rate, channels, wanted)
        while self._queued_s > 0 and self._queued_s + audio.seconds > MAX_QUEUED_S and wanted():
            await self._change()
        if wanted():
            self._queue.append(audio)
            self._queued_s += audio.seconds
            self._changed.set()

    async def interrupt(self) -> None:
        """Drop the audio held here and ask the service to drop the speech not yet spoken (answered
        ``interrupted``)."""
        for item in self._queue:
            if isinstance(item, asyncio.Future) and not item.done():
                item.set_result(None)
        self._queue.clear()
        self._queued_s, self._sent_until = 0.0, 0.0
        self._changed.set()
        if not self._ws.closed:
            await self._ws.send_json(Interrupt().to_json())

    async def end_segment(self) -> int | None:
        """Close the segment pushed since the last close, behind the audio held here: its number, or None when
        nothing was pushed (or the service did not answer)."""
        if self._ws.closed:
            return None
        answer = asyncio.get_running_loop().create_future()
        self._queue.append(answer)
        self._changed.set()
        try:
            return await asyncio.wait_for(asyncio.shield(answer), ANSWER_TIMEOUT_S + self._queued_s)
        except TimeoutError:
            return None

    async def close(self) -> None:
        self._reader.cancel()
        self._sender.cancel()
        await self._ws.close()

    async def _change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def _send(self) -> None:
        """Send what is queued, in order: audio once within ``LEAD_S`` of wall time, segment ends when reached."""
        while True:
            while not self._queue:
                await self._change()
            item = self._queue[0]
            if isinstance(item, asyncio.Future):
                self._queue.popleft()
                if not item.done() and not self._ws.closed:
                    self._segment_answers.append(item)
                    await self._ws.send_json(EndOfSegment().to_json())
                continue
            wait = max(time.monotonic(), self._sent_until) - time.monotonic() + item.seconds - LEAD_S
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._change(), wait)
                continue  # an interrupt may have emptied the queue meanwhile
            self._queue.popleft()
            self._queued_s = max(0.0, self._queued_s - item.seconds)
            self._changed.set()
            if item.wanted() and not self._ws.closed:
                self._sent_until = max(time.monotonic(), self._sent_until) + item.seconds
                if self._format != (item.sample_rate, item.channels):
                    self._format = (item.sample_rate, item.channels)
                    rate, channels = self._format
                    await self._ws.send_json(Format(rate, channels, "s16le").to_json())
                await self._ws.send_bytes(item.pcm)

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                try:
                    self._on(server_message(message.json()))
                except PushMessageError as exc:
                    log.warning("the service sent a message this client does not know: %s", exc)

    def _on(self, event: ServerMessage) -> None:
        segment = getattr(event, "segment", None)
        if isinstance(segment, int):
            self.highest_segment = max(self.highest_segment, segment)
        match event:
            case SegmentEnded():
                while self._segment_answers:
                    answer = self._segment_answers.popleft()
                    if not answer.done():
                        answer.set_result(segment)
                        break
            case Interrupted():
                self.interrupts_answered += 1
                self.cut_through = max(self.cut_through, self.highest_segment)
            case PlaybackFinished():
                self.last_finished = event
            case AheadLimit():
                self.held_back = event
                log.warning("the service holds back this bot's audio: %s", event)
            case Error(message=text):
                log.warning("the service refused a push message: %s", text)

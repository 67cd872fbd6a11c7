"""A client of a session's push WebSocket (docs/push.md): TTS audio, interrupts and segment ends out, playback
events in.

Audio leaves at most ``LEAD_S`` ahead of wall time, below the service's own lead (5 s): the service then never holds
the socket back, so an interrupt is never stuck behind seconds of audio waiting in TCP buffers.

The playback events say when the service showed a frame; the same frame reaches a WHEP viewer later (the encoder,
the WebRTC jitter buffer, the decoder), by a delay that grows when a machine is starved. So the events wait here
until the bot shows the picture the service showed when it sent them (``settle``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp

LEAD_S = 3.0
ANSWER_TIMEOUT_S = 5.0


log = logging.getLogger(__name__)


class PushClient:
    """One push connection and what its playback events say: the segments playing, the last one finished."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._format: tuple[int, int] | None = None
        self._sent_until = 0.0
        self._segment_answers: asyncio.Queue[int | None] = asyncio.Queue()
        self._events: deque[tuple[float, str, int]] = deque()
        self.playing: set[int] = set()
        """Segments whose first speech frame the bot's pictures show and whose last not yet (see ``settle``)."""
        self.finished_through = -1
        """The highest segment whose playback finished in the bot's pictures (segments finish in order)."""
        self.highest_segment = -1
        """The highest segment number the service has named so far."""
        self.last_finished: dict[str, Any] | None = None
        """The last ``playback_finished`` event as it arrived (its ``position``: the seconds of speech shown)."""
        self.interrupts_answered = 0
        self.interrupted_segment: int | None = None
        """The segment the last answered interrupt cut (None: none was open)."""
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, http: aiohttp.ClientSession, url: str) -> PushClient:
        """Open the push socket at ``url`` (the session's ``urls.push``, token included)."""
        return cls(await http.ws_connect(url, heartbeat=10.0))

    async def send_audio(self, pcm: bytes, sample_rate: int, channels: int, wanted: Callable[[], bool]) -> None:
        """Send s16 PCM once it is at most ``LEAD_S`` ahead of wall time; dropped if no longer ``wanted()``."""
        now = time.monotonic()
        self._sent_until = max(now, self._sent_until) + len(pcm) / 2 / channels / sample_rate
        wait = self._sent_until - now - LEAD_S
        if wait > 0:
            await asyncio.sleep(wait)
        if not wanted() or self._ws.closed:
            return
        if self._format != (sample_rate, channels):
            self._format = (sample_rate, channels)
            await self._ws.send_json(
                {"type": "format", "sample_rate": sample_rate, "channels": channels, "encoding": "s16le"}
            )
        await self._ws.send_bytes(pcm)

    async def interrupt(self) -> None:
        """Ask the service to drop the speech not yet spoken (answered ``interrupted``, counted on arrival)."""
        self._sent_until = 0.0
        if not self._ws.closed:
            await self._ws.send_json({"type": "interrupt"})

    async def end_segment(self) -> int | None:
        """Close the segment pushed since the last close: its number, or None when nothing was pushed."""
        if self._ws.closed:
            return None
        await self._ws.send_json({"type": "end_of_segment"})
        try:
            return await asyncio.wait_for(self._segment_answers.get(), ANSWER_TIMEOUT_S)
        except TimeoutError:
            return None

    def settle(self, horizon: float) -> None:
        """Apply the playback events that arrived by ``horizon`` (``time.monotonic()``)."""
        while self._events and self._events[0][0] <= horizon:
            _, kind, segment = self._events.popleft()
            if kind == "playback_started":
                self.playing.add(segment)
            else:
                self.playing.discard(segment)
                self.finished_through = max(self.finished_through, segment)

    async def close(self) -> None:
        self._reader.cancel()
        await self._ws.close()

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            self._on(message.json())

    def _on(self, event: dict[str, Any]) -> None:
        kind, segment = event.get("type"), event.get("segment")
        if isinstance(segment, int):
            self.highest_segment = max(self.highest_segment, segment)
        if kind == "end_of_segment":
            self._segment_answers.put_nowait(segment)
        elif kind == "interrupted":
            self.interrupts_answered += 1
            self.interrupted_segment = segment
        elif kind in ("playback_started", "playback_finished"):
            self._events.append((time.monotonic(), kind, segment))
            if kind == "playback_finished":
                self.last_finished = event
        elif kind == "error":
            log.warning("the service refused a push message: %s", event.get("message"))

"""A TTS-like client of the WebSocket push endpoint: PCM16 sent in small chunks on a real-time clock."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence

import aiohttp
import numpy as np

from streaming.push_messages import ClientMessage, Format, Ready


class Pusher:
    """One push connection; ``play`` sends audio in real time, continuing the clock where the last call left it. Every
    JSON message the server sends is kept in ``events`` (its errors also in ``errors``)."""

    def __init__(self, url: str, rate: int, chunk: int) -> None:
        self.url, self.rate, self.chunk = url, rate, chunk
        self.errors: list[str] = []
        self.events: list[dict] = []
        self.chunks_sent = 0
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None
        self._anchor: float | None = None
        self._position = 0.0

    async def __aenter__(self) -> Pusher:
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(self.url)
        await self.send(Format(self.rate, 1, "s16le"))
        reply = await self._ws.receive_json(timeout=30)
        if reply.get("type") != Ready.TYPE:
            raise RuntimeError(f"the push endpoint refused the format: {reply}")
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                self.events.append(json.loads(message.data))
                if '"error"' in message.data:
                    self.errors.append(message.data)

    async def send(self, message: ClientMessage) -> None:
        """One control message (``EndOfSegment``, ``Interrupt``, ...); its answer arrives in ``events``."""
        await self._ws.send_json(message.to_json())

    @property
    def closed(self) -> bool:
        """The server closed the connection (or it was lost)."""
        return self._ws is None or self._ws.closed

    async def play(self, samples: np.ndarray, marks: Sequence[int] = ()) -> list[float]:
        """Send ``samples`` (float, mono) chunk by chunk at real-time deadlines; the send time of each chunk starting at
        a mark."""
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
        wanted, sent_at = set(marks), {}
        if self._anchor is None:
            self._anchor = time.monotonic()
        for lo in range(0, pcm.size, self.chunk):
            await asyncio.sleep(max(0.0, self._anchor + self._position - time.monotonic()))
            if lo in wanted:
                sent_at[lo] = time.monotonic()
            await self._ws.send_bytes(pcm[lo : lo + self.chunk].tobytes())
            self.chunks_sent += 1
            self._position += min(self.chunk, pcm.size - lo) / self.rate
        return [sent_at[m] for m in marks]

    async def pause(self, seconds: float) -> None:
        """Send nothing for ``seconds`` (the session idles)."""
        self._position += seconds
        await asyncio.sleep(max(0.0, self._anchor + self._position - time.monotonic()) if self._anchor else seconds)

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

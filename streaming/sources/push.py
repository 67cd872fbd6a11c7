"""WebSocket push for TTS engines: declare a PCM format in JSON, send audio as binary messages, change the
session's controls, interrupt or end.

Protocol (one WebSocket per session, ``/push?session=NAME``; every text message below is a typed value of
``streaming.push_messages``):

client -> server, text (JSON):
  {"type": "format", "sample_rate": 24000, "channels": 1, "encoding": "s16le" | "f32le"}
      declares the format of the binary messages that follow; may be sent again to change it.
      The server answers {"type": "ready", "sample_rate": ..., "channels": ..., "encoding": ..., "latency": ...}
      (the session's latency mode, "faithful" or "low", chosen when it was created).
  {"type": "controls", "yaw": 10, "emotion": "happy", ...}
      changes the named session controls (fields of engine.controls.Controls, JSON values; tables as
      lists of rows); the others keep their values. Window controls (emotion, fix_kp_cond,
      fix_kp_cond_dims) act on the next LMDM window, the rest on the next frame rendered. Answered
      {"type": "controls", "applied": {the fields as now in force}}; a bad field or value changes nothing
      and is answered with an error.
  {"type": "end_of_segment"}
                          the speech segment (an utterance: the audio since the last end_of_segment
                          or interrupt) is complete; answered {"type": "end_of_segment", "segment": N},
                          its number (segments are numbered 0, 1, 2, ... in push order; null when
                          nothing was pushed since: no segment).
  {"type": "interrupt"}   drop speech not yet spoken (barge-in), closing the open segment;
                          answered {"type": "interrupted", "segment": N or null}.
  {"type": "end"}         end of input: the session speaks what it has, then ends (the stream
                          stops); answered {"type": "ended"} and the socket is closed.
client -> server, binary: interleaved little-endian PCM in the declared format, a whole number of sample frames,
  at most MAX_MESSAGE_SECONDS of audio (and MAX_MESSAGE_BYTES): longer speech goes in several messages.
server -> client on a bad message: {"type": "error", "message": "..."}; the stream goes on.
server -> client, playback events (the service; see streaming.playback), per segment:
  {"type": "playback_started", "segment": N}   its first speech frame is shown (released by the output clock);
  {"type": "playback_finished", "segment": N, "position": SECONDS, "interrupted": BOOL}
      its last frame has been shown (or it was interrupted): exactly once per segment, also for one
      interrupted before any of it was shown (position 0, no playback_started). ``position``: seconds of
      its speech shown. A segment still open when the stream ends is finished then, as interrupted.
      Every push connection of the session gets them; ``end`` closes the socket at once, so a client that
      wants the last segment's playback_finished waits for it before sending ``end``.
  {"type": "output_failed", "sink": "mp4", "message": "..."}   one of the session's outputs failed and was
      detached (a full disk, an RTMP server that gave up); the session goes on with the others.
  {"type": "session_failed", "message": "..."}   the session failed (its output worker or the engine died): every
      open segment has had its playback_finished (interrupted), and the socket is closed (1011, the message).

  {"type": "ahead_limit", "queued_seconds": S, "limit_seconds": 10.0}   this connection holds as much audio ahead of
      its session as it takes: the server reads no more until the session has taken some (TCP slows the client).

To pause speaking, just stop sending: the avatar idles on silence until audio comes again.
Audio is pushed with backpressure: the session holds its lead (5 s) and the connection reads up to
``MAX_QUEUED_SECONDS`` more ahead of it, so a TTS may pre-fill that much faster than real time;
past that the client is told (``ahead_limit``) and slowed by TCP. Text messages are read meanwhile:
an ``interrupt`` is answered at once and drops everything queued; ``end_of_segment`` and ``end``
wait for the audio before them, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass

import numpy as np
from aiohttp import WSCloseCode, WSMsgType, web

from engine.audio.pcm import MAX_CHANNELS, PcmError, check_rate, to_float_mono
from engine.controls import ControlError, check_changes
from engine.nesting import load_json
from engine.runtime.errors import SessionClosed
from streaming.push_messages import (
    AheadLimit,
    ClientMessage,
    Controls,
    ControlsApplied,
    End,
    Ended,
    EndOfSegment,
    Error,
    Format,
    Interrupt,
    Interrupted,
    PlaybackEvent,
    PushMessage,
    PushMessageError,
    Ready,
    SegmentEnded,
    SessionFailed,
    client_message,
)

log = logging.getLogger(__name__)
ENCODINGS = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}
MAX_MESSAGE_SECONDS = 10.0
"""Audio one binary message may hold: a message is taken whole before the next binary one, so it bounds that wait."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest WebSocket message read at all (aiohttp closes the connection on a larger one)."""
MAX_CLOSE_REASON = 123
"""Bytes a WebSocket close frame's reason may hold (RFC 6455)."""
MAX_CONTROL_DEPTH = 8
"""How deep a text message's JSON may nest (a controls table is three levels)."""
MAX_QUEUED_SECONDS = 10.0
"""Audio a connection reads ahead of what its session has taken (the session holds its own lead, 5 s, beyond): a
client may push this far ahead of real time and still have an ``interrupt`` read and answered at once."""


class ProtocolError(ValueError):
    """A message that breaks the push protocol; reported to the client, the stream goes on."""


@dataclass(frozen=True)
class PushFormat:
    """What the binary messages hold."""

    sample_rate: int
    channels: int
    encoding: str

    def ready(self, latency: str) -> Ready:
        """The answer to the ``format`` message that declared this."""
        return Ready(self.sample_rate, self.channels, self.encoding, latency)


def parse_format(message: Format) -> PushFormat:
    """Validate a ``format`` message."""
    try:
        rate = check_rate(message.sample_rate)
    except PcmError as exc:
        raise ProtocolError(str(exc)) from exc
    channels = message.channels
    if isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= MAX_CHANNELS:
        raise ProtocolError(f"channels must be an integer from 1 to {MAX_CHANNELS}, got {channels!r}")
    encoding = message.encoding
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise ProtocolError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    return PushFormat(rate, channels, encoding)


def decode_chunk(data: bytes, fmt: PushFormat) -> np.ndarray:
    """A binary message as mono float32 samples (channels averaged), or ProtocolError."""
    dtype = ENCODINGS[fmt.encoding]
    frame_bytes = dtype.itemsize * fmt.channels
    if not data or len(data) % frame_bytes:
        raise ProtocolError(
            f"a binary message must hold whole sample frames of {frame_bytes} bytes "
            f"({fmt.encoding}, {fmt.channels} channel(s)); got {len(data)} bytes"
        )
    limit = round(MAX_MESSAGE_SECONDS * fmt.sample_rate)
    if len(data) // frame_bytes > limit:
        raise ProtocolError(
            f"a binary message holds at most {MAX_MESSAGE_SECONDS:g} s of audio ({limit} sample frames at "
            f"{fmt.sample_rate} Hz); got {len(data) // frame_bytes / fmt.sample_rate:.1f} s: send it in pieces"
        )
    pcm = np.frombuffer(data, dtype=dtype).reshape(-1, fmt.channels)
    try:
        return to_float_mono(pcm if fmt.channels > 1 else pcm[:, 0], fmt.channels)
    except PcmError as exc:
        raise ProtocolError(str(exc)) from exc


async def push_handler(request: web.Request, session) -> web.WebSocketResponse:
    """Serve one pushing client until it ends the session or disconnects (``session``: the session's audio side,
    awaited: ``push_audio``, ``update_controls``, ``interrupt``, ``end_segment``, ``end``, ``subscribe``)."""
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, autoclose=False)
    await ws.prepare(request)
    state = PushState(request.query.get("session", ""), ws, session)
    events: asyncio.Queue[PlaybackEvent] = asyncio.Queue()
    unsubscribe = session.subscribe(events.put_nowait)
    sender = asyncio.ensure_future(_send_events(ws, events))
    try:
        async for message in ws:
            try:
                await _handle(ws, message, session, state)
            except SessionClosed:
                await _reply(ws, Error(_ended(state.name)))
            except (ValueError, RuntimeError) as exc:
                await _reply(ws, Error(str(exc)))
            if ws.closed:
                break
        await state.pushed()  # a client that sends its last audio and closes is heard to the end, then answered
        await ws.close()
    finally:
        await state.drop_push()
        unsubscribe()
        sender.cancel()
    return ws


async def _send_events(ws: web.WebSocketResponse, events: asyncio.Queue) -> None:
    """Forward the session's playback events to this client, in order, while it is connected; after a
    ``session_failed`` event close the socket with its message as the reason."""
    while True:
        event = await events.get()
        await _reply(ws, event)
        if isinstance(event, SessionFailed):
            reason = event.message.encode()[:MAX_CLOSE_REASON].decode(errors="ignore")
            await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=reason.encode())
            return


class PushState:
    """One connection's session name, declared format and the audio it has read and the session not yet taken: at most
    ``MAX_QUEUED_SECONDS``, pushed into the session in order by one task while the socket is read on."""

    def __init__(self, name: str, ws: web.WebSocketResponse, session) -> None:
        self.name, self._ws, self._session = name, ws, session
        self.fmt: PushFormat | None = None
        self._queue: deque[tuple[np.ndarray, int]] = deque()
        self.queued_seconds = 0.0
        self._changed = asyncio.Event()
        self._pushing: asyncio.Task | None = None
        self._told = False

    async def add(self, pcm: np.ndarray, rate: int) -> None:
        """Queue a message's audio; past ``MAX_QUEUED_SECONDS`` tell the client (``ahead_limit``, again only once the
        queue has drained by half) and stop reading until there is room (TCP then slows the client)."""
        seconds = pcm.size / rate
        while self.queued_seconds > 0 and self.queued_seconds + seconds > MAX_QUEUED_SECONDS:
            if not self._told:
                self._told = True
                await _reply(self._ws, AheadLimit(round(self.queued_seconds, 3), MAX_QUEUED_SECONDS))
            await self._change()
        self._queue.append((pcm, rate))
        self.queued_seconds += seconds
        if self._pushing is None or self._pushing.done():
            self._pushing = asyncio.ensure_future(self._push_all())

    async def pushed(self) -> None:
        """Wait until the session has taken everything queued."""
        while self._pushing is not None and not self._pushing.done():
            await asyncio.shield(self._pushing)

    async def drop_push(self) -> None:
        """Stop pushing: what the session has not taken yet is dropped."""
        self._queue.clear()
        self.queued_seconds = 0.0
        self._changed.set()
        pushing, self._pushing = self._pushing, None
        if pushing is not None and not pushing.done():
            pushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pushing

    async def _change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def _push_all(self) -> None:
        while self._queue:
            pcm, rate = self._queue[0]
            await _push(self._ws, self._session, self, pcm, rate)
            if self._queue and self._queue[0][0] is pcm:
                self._queue.popleft()
                self.queued_seconds = max(0.0, self.queued_seconds - pcm.size / rate)
            self._told &= self.queued_seconds > MAX_QUEUED_SECONDS / 2  # told again only once it has drained by half
            self._changed.set()


async def _handle(ws: web.WebSocketResponse, message, session, state: PushState) -> None:
    if message.type == WSMsgType.BINARY:
        if state.fmt is None:
            raise ProtocolError('send {"type": "format", ...} before any audio')
        await state.add(decode_chunk(message.data, state.fmt), state.fmt.sample_rate)
    elif message.type == WSMsgType.TEXT:
        await _command(ws, _control(message.data), session, state)
    elif message.type == WSMsgType.ERROR:
        log.warning("push: connection error: %s", ws.exception())


async def _command(ws: web.WebSocketResponse, control: ClientMessage, session, state: PushState) -> None:
    """Carry out one text message and answer it."""
    match control:
        case Format():
            state.fmt = parse_format(control)
            await _reply(ws, state.fmt.ready(session.latency))
        case Controls(changes=changes):
            try:
                fields = check_changes(changes)
            except ControlError as exc:
                raise ProtocolError(str(exc)) from exc
            await _reply(ws, ControlsApplied(await session.update_controls(**fields)))
        case EndOfSegment():
            await state.pushed()
            await _reply(ws, SegmentEnded(await session.end_segment()))
        case Interrupt():
            await state.drop_push()
            await _reply(ws, Interrupted(await session.interrupt()))
        case End():
            await state.pushed()
            await session.end()
            await _reply(ws, Ended())
            await ws.close()


async def _push(ws: web.WebSocketResponse, session, state: PushState, pcm: np.ndarray, rate: int) -> None:
    """Hand one message's audio to the session (it waits for room); a failure is told to the client."""
    try:
        await session.push_audio(pcm, rate)
    except SessionClosed:
        await _reply(ws, Error(_ended(state.name)))
    except (ValueError, RuntimeError) as exc:
        await _reply(ws, Error(str(exc)))


def _ended(name: str) -> str:
    return f"session {name!r} has ended; create a new one with POST /sessions"


async def _reply(ws: web.WebSocketResponse, message: PushMessage) -> None:
    """Answer the client, unless it has gone away meanwhile (a push answered after a disconnect is not an error)."""
    if ws.closed:
        return
    try:
        await ws.send_json(message.to_json())
    except ConnectionResetError:
        log.info("push: the client left before its answer")


def _control(text: str) -> ClientMessage:
    try:
        control = load_json(text, MAX_CONTROL_DEPTH, "a control message")
    except ValueError as exc:
        raise ProtocolError(f"text messages must be JSON: {exc}") from exc
    try:
        return client_message(control)
    except PushMessageError as exc:
        raise ProtocolError(str(exc)) from None

"""A session as the front end holds it: what the client asked for, its state and counters, and its audio side.

``SessionSpec`` is a validated ``POST /sessions`` body; ``ServedSession`` the record the API shows;
``RemoteSession`` the session's audio and commands, sent to the engine core (``serving.client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from engine.controls import ControlError, check_changes
from engine.latency import FAITHFUL, MODES, latency_mode
from engine.nesting import load_json
from engine.runtime.backpressure import push_when_room
from engine.runtime.errors import Backpressure
from serving.api import MAX_BODY_DEPTH, SESSION_FIELDS, ErrorKind, SessionError, SessionState
from serving.protocol import EndSegment, EndSession, Interrupt, PushAudio, UpdateControls
from streaming.output_settings import OutputSettings
from streaming.push_messages import PlaybackEvent, PlaybackFinished, PlaybackStarted, SessionFailed
from streaming.sinks.webrtc import WebRtcPreview
from streaming.targets import TargetError, check_rtmp_urls, check_srt_url, masked_rtmp_url, resolve_mp4_target

if TYPE_CHECKING:
    from serving.client import CoreClient

PUSH_SPLIT_SECONDS = 1.0
"""Pushed audio goes to the core in pieces of at most this much, so no piece waits for more room than a session has."""
AVATAR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A client names a registered avatar; never a path (the server reads no folder a client points it at)."""
LIVEKIT_FIELDS = ("url", "token")
LIVEKIT_SCHEMES = ("wss", "ws", "https", "http")
MAX_LIVEKIT_URL = 2048
MAX_LIVEKIT_TOKEN = 16384
JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


@dataclass(frozen=True)
class SessionSpec:
    """What a client asks for: an avatar by name, where the stream goes, and the session's knobs."""

    avatar: str
    rtmp: tuple[str, ...] = ()
    mp4: str | None = None
    preview: bool = False
    overlap: int | None = None
    """None: the latency mode's (75 faithful, 77 low)."""
    seed: int = 0
    controls: dict[str, Any] | None = None
    latency: str = FAITHFUL.name
    output: OutputSettings = OutputSettings()
    """How the stream is encoded: its size, bitrate, preset, GOP, profile, audio (``streaming.output_settings``)."""
    end_on_disconnect: bool = False
    """End the session once its last push connection has closed without ``end`` (and none came back within
    ``END_ON_DISCONNECT_GRACE``): a client that dies frees its session."""
    livekit: tuple[str, str] | None = field(default=None, repr=False)
    """(url, token) of a LiveKit room the avatar joins (``serving.rooms``); the token is the agent's, never shown."""

    recording: str | None = field(default=None, repr=False)
    """The MP4 target's absolute path inside the recordings folder (``mp4`` is the client's name, the one shown)."""

    @classmethod
    def from_json(cls, body: Any, recordings: Path | None = None) -> SessionSpec:
        """Validate a ``POST /sessions`` body, resolving an MP4 name inside the ``recordings`` folder (None: this server
        records no files); SessionError(invalid) naming the bad field."""
        if not isinstance(body, dict):
            raise SessionError('POST /sessions takes a JSON object, e.g. {"avatar": "anchor"}', ErrorKind.INVALID)
        unknown = set(body) - set(SESSION_FIELDS)
        if unknown:
            raise SessionError(
                f"unknown field(s) {sorted(unknown)}; known: {', '.join(SESSION_FIELDS)}", ErrorKind.INVALID
            )
        avatar = body.get("avatar")
        if not isinstance(avatar, str) or not AVATAR_NAME.fullmatch(avatar):
            raise SessionError(
                '"avatar" (a registered avatar\'s name: letters, digits, ".", "_", "-") is required', ErrorKind.INVALID
            )
        try:
            rtmp = check_rtmp_urls(body.get("rtmp", []))
            mp4, recording = body.get("mp4"), None
            if mp4 is not None:
                recording = str(recording_path(mp4, recordings))
            controls = check_changes(body["controls"]) if body.get("controls") is not None else None
            if body.get("srt") is not None:
                check_srt_urls(body["srt"])
            output = OutputSettings.from_json(body.get("output"))
        except ControlError as exc:
            raise SessionError(f'"controls": {exc}', ErrorKind.INVALID) from None
        except ValueError as exc:  # TargetError, OutputSettingsError and a bad "output" name their field
            raise SessionError(str(exc), ErrorKind.INVALID) from None
        latency = body.get("latency", FAITHFUL.name)
        try:
            latency = latency_mode(latency).name
        except ValueError:
            raise SessionError(f'"latency" is one of {", ".join(MODES)}, got {latency!r}', ErrorKind.INVALID) from None
        livekit = check_livekit(body["livekit"]) if body.get("livekit") is not None else None
        preview, end_on_disconnect = body.get("preview", False), body.get("end_on_disconnect", False)
        for key, value in (("preview", preview), ("end_on_disconnect", end_on_disconnect)):
            if not isinstance(value, bool):
                raise SessionError(f'"{key}" is true or false', ErrorKind.INVALID)
        overlap, seed = body.get("overlap", MODES[latency].overlap), body.get("seed", 0)
        for key, value, low, high in (("overlap", overlap, 0, 79), ("seed", seed, 0, 2**31 - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise SessionError(f'"{key}" is an integer from {low} to {high}, got {value!r}', ErrorKind.INVALID)
        return cls(
            avatar, rtmp, mp4, preview, overlap, seed, controls, latency, output, end_on_disconnect, livekit, recording
        )


def check_srt_urls(value: Any) -> None:
    """Refuse a session's SRT outputs, saying why: this FFmpeg cannot send SRT (``streaming.protocols``), or, where it
    can, the service has no SRT output yet; TargetError either way, naming the field."""
    urls = [value] if isinstance(value, str) else value
    if not isinstance(urls, list):
        raise TargetError("srt", "an srt://host:port URL or a list of them")
    for url in urls:
        check_srt_url(url)
    raise TargetError("srt", "this service has no SRT output yet; send RTMP to a media server that relays it as SRT")


def check_livekit(value: Any) -> tuple[str, str]:
    """A ``livekit`` field: ``{"url": "wss://...", "token": JWT}`` as (url, token); SessionError(invalid) naming the
    field, also when this server cannot join rooms (the ``livekit`` extra is not installed where it runs)."""
    if not isinstance(value, dict):
        raise SessionError(
            '"livekit" is an object {"url": "wss://...", "token": "..."} (a room token)', ErrorKind.INVALID
        )
    unknown = set(value) - set(LIVEKIT_FIELDS)
    if unknown:
        raise SessionError(f'"livekit": unknown field(s) {sorted(unknown)}; known: url, token', ErrorKind.INVALID)
    url, token = value.get("url"), value.get("token")
    if (
        not isinstance(url, str)
        or len(url) > MAX_LIVEKIT_URL
        or not url.isascii()
        or not url.isprintable()
        or " " in url
        or urlsplit(url).scheme not in LIVEKIT_SCHEMES
        or not urlsplit(url).hostname
    ):
        raise SessionError('"livekit.url" is the LiveKit server\'s wss:// (or ws://, https://) URL', ErrorKind.INVALID)
    if not isinstance(token, str) or len(token) > MAX_LIVEKIT_TOKEN or not JWT.fullmatch(token):
        raise SessionError(
            '"livekit.token" is a room token (a JWT) for the avatar, minted by the agent', ErrorKind.INVALID
        )
    if importlib.util.find_spec("livekit.agents") is None:
        raise SessionError(
            '"livekit": this server cannot join LiveKit rooms: install its livekit extra (pip install -e ".[livekit]") '
            "where it runs",
            ErrorKind.INVALID,
        )
    return url, token


def recording_path(name: Any, recordings: Path | None) -> Path:
    """Where MP4 target ``name`` is written: inside the server's recordings folder; TargetError when it has none."""
    if recordings is None:
        raise TargetError("mp4", "this server records no files; start it with --recordings DIR")
    return resolve_mp4_target(name, recordings)


def parse_body(text: str) -> Any:
    """A request body as JSON nested at most MAX_BODY_DEPTH deep; SessionError(invalid) otherwise."""
    try:
        return load_json(text, MAX_BODY_DEPTH, "the request body")
    except ValueError as exc:
        raise SessionError(f"the request body is JSON: {exc}", ErrorKind.INVALID) from None


@dataclass
class ServedSession:
    """One session of the service, as the front end keeps it."""

    id: str
    spec: SessionSpec
    worker: int
    width: int = 0
    height: int = 0
    state: SessionState = SessionState.STARTING
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    preview: WebRtcPreview | None = None
    audio: RemoteSession | None = None
    core_stats: dict[str, Any] = field(default_factory=dict)
    output_stats: dict[str, Any] = field(default_factory=dict)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    push: bool = True
    degraded: bool = False
    """Over the last second more than DEGRADED_SHARE of its output slots were repeats: the device cannot keep up."""
    behind: bool = False
    """Its newest rendered frame is more than BEHIND_SECONDS behind its live clock (said once in the log)."""
    cost_ms: float = 0.0
    """What encoding its stream costs a core per frame (its size and preset, measured): what admission counts."""
    output: dict[str, Any] = field(default_factory=dict)
    """Its output settings in force (``OutputSettings.describe`` at its avatar's size) and ``cost_ms``."""
    pushers: int = 0
    """Push connections open now."""
    on_abandoned: Callable[[], None] | None = field(default=None, repr=False)
    """Called when its last push connection closes while the session is live and was not told to ``end``."""
    joined: asyncio.Future | None = field(default=None, repr=False)
    """A LiveKit session's: resolved with its worker's ``RoomJoined``."""
    room: dict[str, str] | None = None
    """A LiveKit session's room and its avatar's identity there, once joined."""

    @property
    def name(self) -> str:
        return self.id

    @property
    def live(self) -> bool:
        return self.state.live

    def audio_sink(self) -> RemoteSession:
        """Where the push WebSocket sends this session's audio and commands."""
        return self.audio

    @contextlib.contextmanager
    def pushing(self) -> Iterator[None]:
        """Count one push connection while it is open; the last one closing without ``end`` calls ``on_abandoned``."""
        self.pushers += 1
        try:
            yield
        finally:
            self.pushers -= 1
            if not self.pushers and self.live and not self.audio.ending and self.on_abandoned is not None:
                self.on_abandoned()

    def describe(self) -> dict[str, Any]:
        """The session as ``GET /sessions/{id}`` shows it (URLs are added by the API, which knows the host); RTMP URLs
        with their stream keys masked (any client of the API may list every session)."""
        return {
            "id": self.id,
            "state": self.state,
            "error": self.error,
            "avatar": self.spec.avatar,
            "size": [self.width, self.height],
            "outputs": {
                "rtmp": [masked_rtmp_url(url) for url in self.spec.rtmp],
                "mp4": self.spec.mp4,
                "preview": self.spec.preview,
                "livekit": None if self.spec.livekit is None else {"url": self.spec.livekit[0], **(self.room or {})},
            },
            "output": self.output,
            "latency": self.spec.latency,
            "overlap": self.spec.overlap if self.spec.overlap is not None else MODES[self.spec.latency].overlap,
            "seed": self.spec.seed,
            "end_on_disconnect": self.spec.end_on_disconnect,
            "created_at": self.created_at,
            "degraded": self.degraded,
            "behind_seconds": self.output_stats.get("behind_seconds"),
            "counters": {**self.core_stats, **{k: v for k, v in self.output_stats.items() if k != "sinks"}},
            "sinks": self.output_stats.get("sinks", {}),
        }


class RemoteSession:
    """A session's audio side over the core (the push WebSocket and the file or microphone sources use it).

    ``push_audio`` waits while the session holds its lead of audio (the core answers "backpressure"; the wait is
    ``engine.runtime.backpressure``'s), so a client pushing faster than real time is slowed by TCP, and no thread is
    parked meanwhile.
    The session's playback events (``streaming.playback``) go to every subscribed listener.
    """

    def __init__(
        self, core: CoreClient, session_id: str, loop: asyncio.AbstractEventLoop, latency: str = FAITHFUL.name
    ) -> None:
        self._core, self.id, self._loop = core, session_id, loop
        self.latency = latency
        self._listeners: list[Callable[[PlaybackEvent], None]] = []
        self._unfinished: dict[int, float | None] = {}
        """Segments told of but not finished -> when their playback started (None: not yet): finished on a failure."""
        self.ending = False
        """``end`` was asked: the session speaks what it has, then ends."""

    async def push_audio(self, pcm: np.ndarray, sample_rate: int) -> None:
        """Queue mono float32 PCM at ``sample_rate``, in pieces of at most PUSH_SPLIT_SECONDS."""
        pcm = np.ascontiguousarray(pcm, np.float32)
        step = max(1, round(sample_rate * PUSH_SPLIT_SECONDS))
        for start in range(0, pcm.size, step):
            piece = PushAudio(self.id, pcm[start : start + step].tobytes(), int(sample_rate))
            await push_when_room(lambda piece=piece: self._send(piece))

    async def _send(self, piece: PushAudio) -> None:
        """One piece to the core; its "backpressure" refusal raised as the runtime session's ``Backpressure``."""
        try:
            await self._core.request(piece)
        except SessionError as exc:
            if exc.kind == ErrorKind.BACKPRESSURE:
                raise Backpressure(str(exc)) from exc
            raise

    async def update_controls(self, /, **changes: Any) -> dict[str, Any]:
        """Change some controls; the fields as now in force (``self`` positional-only: a control may be called so).
        Checked here first: a value msgpack cannot carry (an integer past 64 bits) is an invalid control."""
        try:
            changes = check_changes(changes)
        except ControlError as exc:
            raise SessionError(str(exc), ErrorKind.INVALID) from None
        return (await self._core.request(UpdateControls(self.id, changes))).applied

    async def interrupt(self) -> int | None:
        """Drop speech not yet spoken; the number of the segment this interrupted (None: none was open)."""
        return (await self._core.request(Interrupt(self.id))).segment

    async def end_segment(self) -> int | None:
        """Close the speech segment pushed since the last close; its number (None: nothing was pushed since)."""
        segment = (await self._core.request(EndSegment(self.id))).segment
        if segment is not None:
            self._unfinished.setdefault(segment, None)
        return segment

    async def end(self) -> None:
        self.ending = True
        await self._core.request(EndSession(self.id))

    def subscribe(self, listener: Callable[[PlaybackEvent], None]) -> Callable[[], None]:
        """Call ``listener`` (on the event loop) with each playback event; returns the call that unsubscribes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:  # gone already when the session failed
                self._listeners.remove(listener)

        return unsubscribe

    def playback(self, event: PlaybackEvent) -> None:
        """Hand one playback event from the session's worker to every listener."""
        if isinstance(event, PlaybackStarted):
            self._unfinished[event.segment] = time.monotonic()
        elif isinstance(event, PlaybackFinished):
            self._unfinished.pop(event.segment, None)
        for listener in tuple(self._listeners):
            listener(event)

    def fail(self, reason: str) -> None:
        """The session failed (its worker or the core died): finish every open segment, as interrupted, and tell the
        listeners, whose sockets then close; no event of the session follows."""
        for segment, started in sorted(self._unfinished.items()):
            position = 0.0 if started is None else round(time.monotonic() - started, 2)
            self.playback(PlaybackFinished(segment, position, interrupted=True))
        self.playback(SessionFailed(reason))
        self._listeners.clear()

    def blocking(self) -> BlockingSession:
        """The same session for threads (the file and microphone sources): each call waits for the event loop."""
        return BlockingSession(self)


class BlockingSession:
    """``RemoteSession`` from another thread, with the runtime session's ``push_audio`` signature."""

    def __init__(self, remote: RemoteSession) -> None:
        self._remote = remote

    def _run(self, coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._remote._loop).result()

    def push_audio(self, pcm: np.ndarray, sample_rate: int, channels: int | None = None, block: bool = False) -> None:
        from engine.audio.pcm import to_float_mono

        self._run(self._remote.push_audio(to_float_mono(pcm, channels), sample_rate))

    def update_controls(self, /, **changes: Any) -> dict[str, Any]:
        return self._run(self._remote.update_controls(**changes))

    def interrupt(self) -> int | None:
        return self._run(self._remote.interrupt())

    def end_segment(self) -> int | None:
        return self._run(self._remote.end_segment())

    def end(self) -> None:
        self._run(self._remote.end())

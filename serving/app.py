"""The HTTP side of the server (aiohttp): preview page, WHEP playback, audio push, /metrics, behind the access rules.

Routes: ``GET /`` the preview page (``?session=NAME``), ``GET /info`` the stream names and the
notice shown on the page, ``POST /whep/NAME`` and ``DELETE /whep/NAME/VIEWER`` WHEP playback
(``serving.whep``: the page plays the preview through it, and so can any WHEP player),
``GET /push?session=NAME`` the WebSocket audio push (see sources/push.py), ``GET /metrics``.
Every route is behind the token, Host and Origin rules of ``serving.access``; a token is given as
``Authorization: Bearer TOKEN`` or ``?token=TOKEN`` (how the page's URL carries it to viewers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Protocol

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from serving.access import Access
from serving.metrics import metrics_registry, render
from serving.whep import add_whep_routes
from streaming.frames import AudioSink
from streaming.output import SessionOutput
from streaming.sinks.webrtc import WebRtcPreview
from streaming.sources.push import push_handler

log = logging.getLogger(__name__)
PAGE = files("serving").joinpath("web", "preview.html")
REQUEST_TIMEOUT = 10.0
"""Seconds a connection has to send a whole request's headers (and may idle between requests) before it is closed."""


class AsyncAudioSink(Protocol):
    """What the push WebSocket drives: a session's audio side, awaited (never parking a thread of the event loop's)."""

    latency: str
    """The session's latency mode (``engine.latency``), told to the pushing client."""

    async def push_audio(self, pcm: np.ndarray, sample_rate: int) -> None: ...

    async def update_controls(self, **changes: Any) -> dict[str, Any]: ...

    async def interrupt(self) -> int | None: ...

    async def end_segment(self) -> int | None: ...

    async def end(self) -> None: ...

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]: ...


class Served(Protocol):
    """One stream the HTTP side offers: its name, its WebRTC preview (or None), whether it takes pushed audio."""

    name: str
    preview: WebRtcPreview | None
    push: bool

    def audio_sink(self) -> AsyncAudioSink: ...


class ThreadedAudioSink:
    """An in-process session (blocking ``push_audio``) as an ``AsyncAudioSink``: its calls run on a worker thread."""

    def __init__(self, session: AudioSink) -> None:
        self.session = session
        self.latency = session.latency.name

    async def push_audio(self, pcm: np.ndarray, sample_rate: int) -> None:
        await asyncio.to_thread(self.session.push_audio, pcm, sample_rate, None, True)

    async def update_controls(self, **changes: Any) -> dict[str, Any]:
        controls = self.session.update_controls(**changes)
        return {k: v for k, v in controls.to_dict().items() if k in changes}

    async def interrupt(self) -> int | None:
        return self.session.interrupt()

    async def end_segment(self) -> int | None:
        return await asyncio.to_thread(self.session.end_segment)

    async def end(self) -> None:
        await asyncio.to_thread(self.session.end)

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """In-process streams send no playback events (the service's output workers make them); nothing to undo."""
        return lambda: None


@dataclass
class Stream:
    """One session served in this process: its runtime session, its output and what the HTTP side offers for it."""

    name: str
    session: object
    output: SessionOutput
    preview: WebRtcPreview | None = None
    push: bool = False

    def audio_sink(self) -> AsyncAudioSink:
        return ThreadedAudioSink(self.session)


def create_app(
    streams: list[Stream],
    token: str | None = None,
    notice: str = "",
    runtime_metrics: Callable[[], dict] | None = None,
    bound: tuple[str, int] | None = None,
) -> web.Application:
    """The aiohttp application serving in-process ``streams``; ``runtime_metrics`` (the runtime's ``metrics``) adds its
    figures to /metrics; ``bound`` (host, port) is the address served, for the Host check (None: any Host)."""
    by_name = {s.name: s for s in streams}
    registry = metrics_registry(lambda: streams, runtime_metrics)
    return stream_app(lambda: by_name, token, notice, registry, bound)


def stream_app(
    streams: Callable[[], Mapping[str, Served]],
    token: str | None,
    notice: str,
    registry: CollectorRegistry,
    bound: tuple[str, int] | None = None,
) -> web.Application:
    """The routes every server has (preview page, info, WHEP, push, metrics) over the streams ``streams()`` names now."""
    app = web.Application(middlewares=[_access_middleware(Access.bound(bound, token))])

    def stream_for(request: web.Request) -> Served:
        served = streams()
        name = request.query.get("session", next(iter(served), ""))
        if name not in served:
            raise web.HTTPNotFound(text=f"no session {name!r}; sessions: {', '.join(served) or 'none'}")
        return served[name]

    async def page(request: web.Request) -> web.Response:
        if not any(s.preview for s in streams().values()):
            raise web.HTTPNotFound(text="no WebRTC preview is enabled (start with --webrtc HOST:PORT)")
        return web.Response(text=PAGE.read_text(), content_type="text/html")

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"sessions": list(streams()), "notice": notice})

    def preview_for(name: str) -> WebRtcPreview:
        served = streams()
        if name not in served:
            raise web.HTTPNotFound(text=f"no session {name!r}; sessions: {', '.join(served) or 'none'}")
        if served[name].preview is None:
            raise web.HTTPNotFound(text=f"session {name!r} has no WebRTC preview")
        return served[name].preview

    async def push(request: web.Request) -> web.StreamResponse:
        stream = stream_for(request)
        if not stream.push:
            raise web.HTTPNotFound(text=f"session {stream.name!r} takes no pushed audio (start with --listen)")
        return await push_handler(request, stream.audio_sink())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=await asyncio.to_thread(render, registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/", page)
    app.router.add_get("/info", info)
    add_whep_routes(app, preview_for)
    app.router.add_get("/push", push)
    app.router.add_get("/metrics", metrics)
    return app


def app_runner(app: web.Application, timeout: float = REQUEST_TIMEOUT) -> web.AppRunner:
    """A runner for ``app`` that closes connections idle or half-sent (no complete request) ``timeout`` s after they open
    or since their last answer (aiohttp's keep-alive timer, which also covers the first request), without access log."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=timeout)


def _access_middleware(access: Access):
    """Answer a request the token, Host or Origin rules do not let in (``serving.access``) before any route sees it."""

    @web.middleware
    async def check(request: web.Request, handler):
        refusal = access.check(request.method, request.headers, request.query.get("token", ""))
        if refusal is not None:
            return web.Response(status=refusal.status, text=refusal.text)
        return await handler(request)

    return check

"""The front end's HTTP side (aiohttp): the session API, and the routes every session has, behind the access rules.

    POST   /sessions         {"avatar": NAME, "rtmp": URL | [URL...], "mp4": PATH, "preview": bool,
                              "overlap": 75, "seed": 0, "controls": {...}, "output": {"size": "720p", ...}}
                             -> 201 {"id": ..., "urls": {...}, ...}
    GET    /sessions         -> {"sessions": [...], "capacity": {...}, "encoding": {...}, "avatars": [...]}
    GET    /sessions/{id}    -> the session: state, counters, URLs
    DELETE /sessions/{id}    -> ends it now; its outputs flush and close; 200 with its final state

Beyond capacity POST answers 503 naming it; an unknown avatar is a 404 naming the registered ones, an unknown id a
404, a bad body a 400; every error is JSON ``{"error": "...", "kind": "..."}`` (``serving.api``). Beside them: ``GET
/`` the preview page (``?session=NAME``), ``GET /info`` the session names and the notice shown on the page, ``POST
/whep/NAME`` and ``DELETE /whep/NAME/VIEWER`` WHEP playback (``serving.whep``: the page plays the preview through it,
and so can any WHEP player), ``GET /push?session=NAME`` the WebSocket audio push (``streaming.sources.push``), ``GET
/metrics``.
Every route is behind the token, Host and Origin rules of ``serving.access``; a token is given as ``Authorization:
Bearer TOKEN`` or ``?token=TOKEN`` (how the page's URL carries it to viewers).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from importlib.resources import files
from typing import Any, Protocol

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from serving.access import Access
from serving.api import ErrorKind, SessionError, error_body
from serving.metrics import render, stream_families
from serving.renders import Renders
from serving.service import Service
from serving.sessions import ServedSession, SessionSpec, parse_body
from serving.whep import add_whep_routes
from streaming.sinks.webrtc import WebRtcPreview
from streaming.sources.push import MAX_CLOSE_REASON, push_handler

PAGE = files("serving").joinpath("web", "preview.html")
IDLE_TIMEOUT = 30.0
"""Seconds a connection may wait for a whole request's headers, when it opens or between two requests, before the server
closes it. Twice what aiohttp's client keeps an idle connection pooled (15 s): a server that closes first races a
client reusing the connection at that moment, and a POST (which no client retries) then meets a dropped connection."""
SHUTDOWN_TIMEOUT = 3.0
"""Seconds a stopping server waits for the requests it is answering before it cancels them (aiohttp waits 60)."""
WEBSOCKETS = web.AppKey("websockets", weakref.WeakSet)
"""The app's open WebSockets (push connections), closed with a reason when the server stops."""


class AsyncAudioSink(Protocol):
    """What the push WebSocket drives: a session's audio side, awaited (never parking a thread of the event loop's)."""

    latency: str
    """The session's latency mode (``engine.latency``), told to the pushing client."""

    async def push_audio(self, pcm: np.ndarray, sample_rate: int) -> None: ...

    async def update_controls(self, /, **changes: Any) -> dict[str, Any]: ...

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

    def pushing(self) -> AbstractContextManager[None]:
        """Held while a push connection is open (the service may end a session whose last one left)."""
        ...


class ServiceCollector:
    """/metrics of the service: every session's counters (the core's and its worker's), the runtime's figures,
    capacity."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.runtime: dict[str, Any] = {}

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        sessions = list(self.service.sessions.values())  # scraped on a worker thread while the loop may add one
        snapshots = {
            s.id: {**s.output_stats, "session": s.core_stats, "viewers": s.preview.viewers if s.preview else None}
            for s in sessions
        }
        yield from stream_families(snapshots, sum(s.live for s in sessions), self.runtime)
        degraded = GaugeMetricFamily(
            "ditto_session_degraded", "1 while the session sheds more than a tenth of its frames", labels=["session"]
        )
        for s in sessions:
            if s.live:
                degraded.add_metric([s.id], int(s.degraded))
        yield degraded
        capacity = GaugeMetricFamily(
            "ditto_capacity", "Live sessions served in real time: runtime, outputs, admitted", labels=["kind"]
        )
        for kind, value in self.service.budget.capacity().items():
            if value is not None:
                capacity.add_metric([kind], value)
        yield capacity
        if self.service.renders is not None:
            yield from render_families(self.service.renders)
        share = self.service.budget.encoding()["measured_share"]
        if share is not None:
            yield GaugeMetricFamily(
                "ditto_output_measured_share",
                "What the live streams use of their calibrated encode cost, as admission counts it",
                value=share,
            )


def render_families(renders: Renders):
    """The render jobs' figures: jobs by state, frames written, the running job's frames per second."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    counts = renders.counts()
    jobs = GaugeMetricFamily("ditto_render_jobs", "Render jobs queued and running now", labels=["state"])
    for state in ("queued", "running"):
        jobs.add_metric([state], counts[state])
    yield jobs
    ended = CounterMetricFamily("ditto_render_jobs_ended", "Render jobs ended since the start", labels=["state"])
    for state in ("done", "failed", "cancelled"):
        ended.add_metric([state], counts[state])
    yield ended
    yield CounterMetricFamily("ditto_render_frames", "Frames of finished render jobs", value=counts["frames"])
    yield GaugeMetricFamily(
        "ditto_render_frames_per_second", "Frames per second the running render job writes", value=renders.offline_fps()
    )


def create_service_app(
    service: Service,
    token: str | None = None,
    notice: str = "",
    bound: tuple[str, int] | None = None,
    origins: tuple[str, ...] = (),
) -> web.Application:
    """The service's application: the session API, and the preview, push and /metrics routes over its sessions;
    ``bound`` (host, port) is the address served, for the Host and Origin checks, ``origins`` the other pages allowed
    to use it from a browser (``serving.access``)."""
    from prometheus_client import CollectorRegistry

    collector = ServiceCollector(service)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def live() -> dict[str, ServedSession]:
        return {s.id: s for s in service.sessions.values() if s.live}

    app = stream_app(live, token, notice, registry, bound, origins)

    def described(request: web.Request, session: ServedSession) -> dict[str, Any]:
        return {**session.describe(), "urls": session_urls(request, session, token)}

    async def create(request: web.Request) -> web.Response:
        spec = SessionSpec.from_json(parse_body(await request.text()), service.recordings)
        session = await service.create(spec)
        return web.json_response(described(request, session), status=201)

    async def listing(request: web.Request) -> web.Response:
        await _refresh(service, collector)
        return web.json_response(
            {
                "sessions": [described(request, s) for s in service.sessions.values()],
                "capacity": service.budget.capacity(),
                "encoding": service.budget.encoding(),
                "avatars": list(service.core_info.avatars) if service.core_info else [],
            }
        )

    async def one(request: web.Request) -> web.Response:
        await _refresh(service, collector)
        return web.json_response(described(request, service.get(request.match_info["id"])))

    async def delete(request: web.Request) -> web.Response:
        try:
            session = await service.delete(request.match_info["id"])
        except TimeoutError:
            raise SessionError("the session's outputs did not close in time", ErrorKind.TIMEOUT) from None
        service.forget(session.id)
        return web.json_response(described(request, session))

    async def metrics_refresh(app: web.Application) -> None:
        async def every_second() -> None:
            while True:
                await _refresh(service, collector)
                await asyncio.sleep(1.0)

        task = asyncio.ensure_future(every_second())
        yield
        task.cancel()

    if service.renders is not None:
        from serving.render_routes import add_render_routes

        add_render_routes(app, service)
    app.router.add_post("/sessions", create)
    app.router.add_get("/sessions", listing)
    app.router.add_get("/sessions/{id}", one)
    app.router.add_delete("/sessions/{id}", delete)
    app.cleanup_ctx.append(metrics_refresh)
    return app


def session_urls(request: web.Request, session: ServedSession, token: str | None) -> dict[str, str]:
    """Where a session is reached, as its client was answered from ``request``'s host (with the token where a browser
    needs it in the URL)."""
    base = f"{request.scheme}://{request.host}"
    suffix = f"&token={token}" if token else ""
    found = {
        "self": f"{base}/sessions/{session.id}",
        "push": f"ws://{request.host}/push?session={session.id}{suffix}",
    }
    if session.preview is not None:
        found["preview"] = f"{base}/?session={session.id}{suffix}"
        found["whep"] = f"{base}/whep/{session.id}"  # a WHEP player sends the token as a bearer header
    return found


def stream_app(
    streams: Callable[[], Mapping[str, Served]],
    token: str | None,
    notice: str,
    registry: CollectorRegistry,
    bound: tuple[str, int] | None = None,
    origins: tuple[str, ...] = (),
) -> web.Application:
    """The routes every server has (preview page, info, WHEP, push, metrics) over the streams ``streams()`` names now;
    ``origins``: the pages of other origins allowed to use them from a browser (``serving.access``)."""
    app = web.Application(middlewares=[_access_middleware(Access.bound(bound, token, origins))])
    app[WEBSOCKETS] = weakref.WeakSet()

    async def track(request: web.Request, response: web.StreamResponse) -> None:
        if isinstance(response, web.WebSocketResponse):
            app[WEBSOCKETS].add(response)

    app.on_response_prepare.append(track)

    def stream_for(request: web.Request) -> Served:
        served = streams()
        name = request.query.get("session", "")
        if not name:
            raise web.HTTPBadRequest(text="name the session: /push?session=ID (POST /sessions answers its id and URLs)")
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
            raise web.HTTPNotFound(
                text=f"session {stream.name!r} takes no pushed audio (a LiveKit session's comes from its room; one "
                "opened at start takes it with --listen)"
            )
        with stream.pushing():
            return await push_handler(request, stream.audio_sink())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=await asyncio.to_thread(render, registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app.router.add_get("/", page)
    app.router.add_get("/info", info)
    add_whep_routes(app, preview_for)
    app.router.add_get("/push", push)
    app.router.add_get("/metrics", metrics)
    return app


def app_runner(app: web.Application, timeout: float = IDLE_TIMEOUT) -> web.AppRunner:
    """A runner for ``app`` that closes connections idle or half-sent (no complete request) ``timeout`` s after they
    open or since their last answer (aiohttp's keep-alive timer, which also covers the first request), and at its
    cleanup waits SHUTDOWN_TIMEOUT for the answers being made; without access log."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=timeout, shutdown_timeout=SHUTDOWN_TIMEOUT)


async def close_websockets(app: web.Application, code: int, reason: str) -> None:
    """Close every open WebSocket of ``app`` (``stream_app``'s) with ``code`` and ``reason``: its client hears why,
    not a dropped connection, and its handler ends, so the server's stop does not wait for it."""
    message = reason.encode()[:MAX_CLOSE_REASON]
    await asyncio.gather(
        *(ws.close(code=code, message=message) for ws in list(app[WEBSOCKETS]) if not ws.closed),
        return_exceptions=True,
    )


async def _refresh(service: Service, collector: ServiceCollector) -> None:
    """Fresh counters from the core (the workers report theirs every second on their own)."""
    try:
        collector.runtime = await service.refresh()
    except (TimeoutError, SessionError):
        collector.runtime = {}


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None, kind: ErrorKind | None = None
) -> web.Response:
    """An error answer in the API's one shape (``serving.api.error_body``) with ``status``; ``kind`` defaults to the
    status's."""
    kept = {k: v for k, v in (headers or {}).items() if k.lower() not in ("content-type", "content-length")}
    body = error_body(message, kind or ErrorKind.of_status(status))
    return web.json_response(body, status=status, headers=kept)


def _access_middleware(access: Access):
    """Answer a request the token, Host or Origin rules do not let in (``serving.access``) before any route sees it;
    answer an allowed origin's CORS preflight, add the CORS headers its requests need, and give every error as JSON (a
    route refuses by raising ``SessionError``, whose kind gives the status)."""

    @web.middleware
    async def check(request: web.Request, handler):
        preflight = access.preflight(request.method, request.headers)
        if preflight is not None:
            return web.Response(status=204, headers=preflight)
        cors = access.cors(request.headers)
        refusal = access.check(request.method, request.headers, request.query.get("token", ""))
        if refusal is not None:
            return error_response(refusal.status, refusal.text, cors)
        try:
            response = await handler(request)
        except SessionError as exc:
            return error_response(exc.kind.status, str(exc), cors, exc.kind)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, exc.text or exc.reason, {**exc.headers, **cors})
        if not response.prepared:
            response.headers.update(cors)
        return response

    return check

"""The session API of the service, over HTTP (aiohttp), beside the routes every server has (``serving.app``).

    POST   /sessions         {"avatar": NAME, "rtmp": URL | [URL...], "mp4": PATH, "preview": bool,
                              "overlap": 75, "seed": 0, "controls": {...}}   -> 201 {"id": ..., "urls": {...}, ...}
    GET    /sessions         -> {"sessions": [...], "capacity": {...}, "avatars": [...]}
    GET    /sessions/{id}    -> the session: state, counters, URLs
    DELETE /sessions/{id}    -> ends it now; its outputs flush and close; 200 with its final state

Beyond capacity POST answers 503 naming it; an unknown avatar is a 404 naming the registered ones,
an unknown id a 404, a bad body a 400. Same token rules as every other route.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from serving.app import stream_app
from serving.metrics import stream_families
from serving.service import Service
from serving.sessions import ServedSession, SessionError, SessionSpec

STATUS = {
    "admission": web.HTTPServiceUnavailable, "not_found": web.HTTPNotFound, "invalid": web.HTTPBadRequest,
    "closed": web.HTTPConflict, "backpressure": web.HTTPServiceUnavailable, "internal": web.HTTPInternalServerError,
}


class ServiceCollector:
    """/metrics of the service: every session's counters (the core's and its worker's), the runtime's figures, capacity."""

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
        degraded = GaugeMetricFamily("ditto_session_degraded", "1 while the session sheds more than a tenth of its frames", labels=["session"])
        for s in sessions:
            if s.live:
                degraded.add_metric([s.id], int(s.degraded))
        yield degraded
        capacity = GaugeMetricFamily("ditto_capacity", "Live sessions served in real time: runtime, outputs, admitted", labels=["kind"])
        for kind, value in self.service.capacity().items():
            if value is not None:
                capacity.add_metric([kind], value)
        yield capacity


def create_service_app(
    service: Service, token: str | None = None, notice: str = "", bound: tuple[str, int] | None = None
) -> web.Application:
    """The service's application: the session API, and the preview, push and /metrics routes over its sessions;
    ``bound`` (host, port) is the address served, for the Host and Origin checks (``serving.access``)."""
    from prometheus_client import CollectorRegistry

    collector = ServiceCollector(service)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app = stream_app(lambda: {s.id: s for s in service.sessions.values() if s.live}, token, notice, registry, bound)

    def urls(request: web.Request, session: ServedSession) -> dict[str, str]:
        base = f"{request.scheme}://{request.host}"
        suffix = f"&token={token}" if token else ""
        found = {"self": f"{base}/sessions/{session.id}", "push": f"ws://{request.host}/push?session={session.id}{suffix}"}
        if session.preview is not None:
            found["preview"] = f"{base}/?session={session.id}{suffix}"
        return found

    def described(request: web.Request, session: ServedSession) -> dict[str, Any]:
        return {**session.describe(), "urls": urls(request, session)}

    async def create(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"POST /sessions takes JSON: {exc}") from exc
        try:
            session = await service.create(SessionSpec.from_json(body))
        except SessionError as exc:
            raise _http(exc) from exc
        return web.json_response(described(request, session), status=201)

    async def listing(request: web.Request) -> web.Response:
        await _refresh(service, collector)
        return web.json_response(
            {
                "sessions": [described(request, s) for s in service.sessions.values()],
                "capacity": service.capacity(),
                "avatars": list(service.core_info.avatars) if service.core_info else [],
            }
        )

    async def one(request: web.Request) -> web.Response:
        await _refresh(service, collector)
        try:
            return web.json_response(described(request, service.get(request.match_info["id"])))
        except SessionError as exc:
            raise _http(exc) from exc

    async def delete(request: web.Request) -> web.Response:
        try:
            session = await service.delete(request.match_info["id"])
        except SessionError as exc:
            raise _http(exc) from exc
        except asyncio.TimeoutError as exc:
            raise web.HTTPGatewayTimeout(text="the session's outputs did not close in time") from exc
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

    app.router.add_post("/sessions", create)
    app.router.add_get("/sessions", listing)
    app.router.add_get("/sessions/{id}", one)
    app.router.add_delete("/sessions/{id}", delete)
    app.cleanup_ctx.append(metrics_refresh)
    return app


async def _refresh(service: Service, collector: ServiceCollector) -> None:
    """Fresh counters from the core (the workers report theirs every second on their own)."""
    try:
        collector.runtime = await service.refresh()
    except (SessionError, asyncio.TimeoutError):
        collector.runtime = {}


def _http(error: SessionError) -> web.HTTPException:
    """The HTTP answer for a refused request: 503 beyond capacity, 404 unknown, 400 invalid, 409 closed."""
    return STATUS.get(error.kind, web.HTTPInternalServerError)(text=str(error))

"""One engine per GPU as a Ray Serve replica: the service's core and output workers, and its own HTTP server.

A replica holds one ``serving.service.Service`` (an engine core on the GPU Ray gave it, through
``CUDA_VISIBLE_DEVICES``, and its output workers) and serves that service's whole HTTP side on an
address of its node (``serving.http``: sessions, push WebSocket, WebRTC signalling, /metrics), so
a session's push, signalling and media stay on the replica that holds it, and RTMP and WebRTC
leave from its node. Its render jobs (``serving.renders``, when the deployment takes them) are on the same
HTTP server, their files in a subfolder of the renders folder of its own (``replica_renders``); the ingress
sends them there (``cluster.render_ingress``). Through Serve it answers only what placement needs: ``create``
(a session here, answered with URLs of this replica), ``record_routing_stats`` (its free capacity, from the
engine's own admission, its render queue and its URL), ``check_health`` (the engine core still answers) and
the drain when Serve removes it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from cluster.local import stop_now_requested
from cluster.reports import summary
from serving.access import is_loopback
from serving.http import app_runner, close_websockets, create_service_app
from serving.processes import ServiceOptions
from serving.renders import RenderLimits
from serving.service import Service

log = logging.getLogger("cluster.replica")
DRAIN_SECONDS = 600.0
"""How long a replica chosen for removal waits for its live sessions to end before it ends them (10 minutes)."""
HEALTH_TIMEOUT = 5.0
"""The health floor on a GPU: seconds the engine core has to answer, and the least a tick may take before its loop
counts as stopped."""
CPU_HEALTH_TIMEOUT = 300.0
"""The health floor on the CPU, where the first tick of a session's first window (nothing timed yet) renders its
frames for a minute or more on a loaded machine."""
TICK_FACTOR = 4.0
"""A loop counts as stopped once its counter stood still this many times its slowest recent tick (or the floor)."""
DRAIN_POLL = 0.5


def default_health_timeout(device: str) -> float:
    """The default health floor for ``device`` (cuda or cpu)."""
    return CPU_HEALTH_TIMEOUT if device == "cpu" else HEALTH_TIMEOUT


def log_to_driver() -> None:
    """Send the service's own log lines (its start timeline, this replica's URL, failures) to this process's stderr,
    which Ray forwards to the driver's terminal."""
    for name in ("serving", "cluster"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)


def render_limits(renders: Mapping[str, Any]) -> RenderLimits:
    """``RenderLimits`` from plain data: a serve config's ``renders`` mapping, or what ``asdict`` made of the command
    line's; ValueError naming what is wrong (the folder is required, and absolute: a replica's working folder is
    Ray's)."""
    known = {f.name for f in fields(RenderLimits)}
    unknown = set(renders) - known
    if unknown:
        raise ValueError(f"renders: unknown field(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
    folder, audio = renders.get("folder"), renders.get("audio_folder")
    if folder is None or not Path(folder).is_absolute() or (audio is not None and not Path(audio).is_absolute()):
        raise ValueError("renders: folder (and audio_folder, if given) are absolute paths, the same on every node")
    return RenderLimits(**{**renders, "folder": Path(folder), "audio_folder": audio and Path(audio)})


def replica_renders(renders: Mapping[str, Any] | None, replica: str) -> RenderLimits | None:
    """A replica's render limits (None: it takes no jobs), its files in ``replica-ID`` inside the renders folder:
    replicas of one node (or of a shared mount) share the folder, and one's jobs never touch another's files."""
    if renders is None:
        return None
    limits = render_limits(renders)
    return replace(limits, folder=limits.folder / f"replica-{replica}")


def live_sessions(service: Service) -> int:
    """The service's live sessions."""
    return sum(s.live for s in service.sessions.values())


def service_figures(service: Service, draining: bool = False, failed: bool = False) -> dict[str, Any]:
    """A service's capacity (the engine's admission) and use, and its render queue (None: it takes no jobs): what a
    replica reports, and what the ingress ranks replicas by for a render job."""
    admitted = service.budget.capacity()["admitted"]
    live = live_sessions(service)
    free = 0 if draining or failed else max(0, admitted - live)
    renders = None
    if service.renders is not None:
        counts = service.renders.counts()
        renders = {"limit": service.renders.limits.queue, "queued": counts["queued"], "running": counts["running"]}
    return {"capacity": {"admitted": admitted, "live": live, "free": free, "draining": draining}, "renders": renders}


def replica_app(
    service: Service, token: str | None, notice: str, bound: tuple[str, int], figures: Callable[[], dict[str, Any]]
) -> web.Application:
    """A replica's HTTP application: the service's own (``serving.http``: sessions, render jobs, push, WHEP, /metrics)
    and ``GET /replica``, ``figures()`` now (the ingress ranks replicas for a render job by it)."""
    app = create_service_app(service, token, notice, bound=bound)

    async def replica_route(request: web.Request) -> web.Response:
        return web.json_response(figures())

    app.router.add_get("/replica", replica_route)
    return app


class TickWatch:
    """Whether the runtime loop still ticks: with live sessions its ``ticks`` counter must move (every live session
    has work every hop, speech or idle). A slow loop is not a stopped one: the counter may stand still for
    ``TICK_FACTOR`` times the slowest recent tick, or ``floor`` seconds, whichever is longer; overload is admission's
    and shedding's business. Runtimes without the counter (the tests' synthetic one) are not watched."""

    def __init__(self, floor: float, factor: float = TICK_FACTOR) -> None:
        self.floor, self.factor = floor, factor
        self._last: tuple[Any, float] = (None, 0.0)

    def limit(self, slowest_ms: float | None) -> float:
        """Seconds the counter may stand still, given the slowest recent tick (ms; None before any)."""
        return max(self.floor, self.factor * (slowest_ms or 0.0) / 1000)

    def stalled(self, ticks: int | None, slowest_ms: float | None, live: int, now: float) -> str | None:
        """The reason the loop counts as stopped, or None; called with each health check's figures."""
        if ticks is None or not live or ticks != self._last[0]:
            self._last = (ticks, now)
            return None
        still, limit = now - self._last[1], self.limit(slowest_ms)
        if still > limit:
            slowest = f"{slowest_ms / 1000:.1f} s" if slowest_ms else "none timed yet"
            return (
                f"its runtime loop has not ticked for {still:.0f} s with {live} live session(s) (the limit: "
                f"{limit:.0f} s, {self.factor:g} x its slowest recent tick ({slowest}) or the floor of "
                f"{self.floor:g} s)"
            )
        return None


@dataclass(frozen=True)
class ReplicaConfig:
    """What every replica of the engine deployment is started with (plain data: Serve sends it to each replica)."""

    service: dict[str, Any] = field(default_factory=dict)
    """``serving.service.ServiceOptions`` fields (any of them: checkpoints, device, steps, plans, admission, workers,
    avatars, loopback_only, runtime, renders as ``RenderLimits``' fields...); the replica's WebRTC stays on loopback
    when its ``host`` is."""
    host: str = "127.0.0.1"
    """Where the replica's HTTP server binds; 0.0.0.0 serves remote clients (then a token is required) at the node's
    IP."""
    token: str | None = None
    notice: str = ""
    drain_seconds: float = DRAIN_SECONDS
    health_timeout: float = HEALTH_TIMEOUT


class EngineReplica:
    """The Serve deployment class: one engine (core + output workers) and its HTTP server, per GPU."""

    async def __init__(self, config: dict[str, Any]) -> None:
        from ray import serve

        log_to_driver()
        self.config = ReplicaConfig(**config)
        self.id = serve.get_replica_context().replica_id.unique_id
        self.failure: str | None = None
        self.draining = False
        self._reports = 0
        self._answered = 0
        self._ticks = TickWatch(self.config.health_timeout)
        self._closed = True  # nothing started yet: nothing for ``__del__`` to stop
        host = self.config.host
        if not is_loopback(host) and not self.config.token:
            raise ValueError(f"a replica serving {host} (beyond loopback) needs a token")
        service = self.config.service
        options = ServiceOptions(**{**service, "renders": replica_renders(service.get("renders"), self.id)})
        loopback = options.loopback_only and is_loopback(host)
        self.service = Service(replace(options, loopback_only=loopback, core_restarts=0))  # Serve replaces a replica
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._closed = False
        try:
            await self._start(host)
        except BaseException:
            await self._close()  # a failed start leaves no engine, worker or service folder behind
            raise

    async def _start(self, host: str) -> None:
        """Start the service (its engine warms up), then this replica's HTTP server on ``host`` and its client."""
        from ray.util import get_node_ip_address

        wildcard = host in ("", "0.0.0.0", "::")
        await self.service.start()
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listener.bind((host, 0))
        port = listener.getsockname()[1]
        advertised = get_node_ip_address() if wildcard else host
        self.netloc = f"[{advertised}]:{port}" if ":" in advertised else f"{advertised}:{port}"
        self._local = f"http://{'127.0.0.1' if wildcard else self.netloc}"
        app = replica_app(self.service, self.config.token, self.config.notice, (host, port), self.figures)
        self._runner = app_runner(app)
        await self._runner.setup()
        await web.SockSite(self._runner, listener).start()
        self._http = aiohttp.ClientSession()
        log.info("replica %s: %s, serving http://%s", self.id, self.service.core_info.device, self.netloc)

    # -- what Serve calls -------------------------------------------------------------------

    async def create(self, body: bytes, refused: Sequence[str] = ()) -> dict[str, Any]:
        """``POST /sessions`` on this replica's own API, so the answer (and its URLs) is the replica's: status, body,
        and this replica's figures (a refusal carries them to the ingress, which names the cluster's capacity).
        ``refused`` (the replicas that refused this POST before) is for the router, which ranks them last."""
        headers = {"Host": self.netloc, "Content-Type": "application/json"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        try:
            async with self._http.post(f"{self._local}/sessions", data=body, headers=headers) as response:
                text = await response.text()
                return {
                    "status": response.status,
                    "body": text,
                    "json": response.content_type == "application/json",
                    **self.figures(),
                }
        finally:
            self._answered += 1  # after the session counts in free (or was refused): what reports say with "answered"

    async def record_routing_stats(self) -> dict[str, Any]:
        """What the capacity router places by: the free room, ``seq`` numbering the reports, and ``answered`` (the
        create calls answered so far), so the router knows which of the sessions it sent a report already counts;
        with the render queue and this replica's URL, which the ingress sends render jobs to."""
        self._reports += 1
        return {**summary(self.figures()), "seq": self._reports, "answered": self._answered}

    async def check_health(self) -> None:
        """Raise when the engine core does not answer in ``health_timeout`` s, its runtime loop's tick counter
        stood still longer than ``TickWatch`` allows with live sessions, or the core has failed; the sessions then
        end at once with that reason, and Serve replaces this replica."""
        if self.failure is None and self.service.failure is not None:
            self._fail(f"replica {self.id}: {self.service.failure}")
        if self.failure is None:
            try:
                timeout = self.config.health_timeout
                figures = await asyncio.wait_for(self.service.refresh(timeout), timeout + 1.0)
            except TimeoutError:
                self._fail(
                    f"replica {self.id}: its engine core did not answer for {self.config.health_timeout:g} s "
                    "(its loop stopped ticking); the replica is being replaced"
                )
            else:
                stalled = self._ticks.stalled(
                    figures.get("ticks"), figures.get("tick_wall_ms_recent_max"), self._live(), time.monotonic()
                )
                if stalled:
                    self._fail(f"replica {self.id}: {stalled}; the replica is being replaced")
        if self.failure is not None:
            await self._close_websockets(1011, self.failure)
            raise RuntimeError(self.failure)

    async def __del__(self) -> None:
        """Serve removes this replica (scale-down, redeploy, failed health): stop admitting, let the live sessions and
        the render jobs queued or running end for up to ``drain_seconds``, end what is left with that reason, then stop
        the engine."""
        if self._closed:
            return
        if self.failure is None:
            self.draining = True
            self.service.refusing = f"replica {self.id} is draining for removal; it admits no new session or render job"
            deadline = time.monotonic() + self.config.drain_seconds
            if not stop_now_requested():
                log.info(
                    "replica %s: draining %d live session(s) and %d render job(s), for at most %g s",
                    self.id,
                    self._live(),
                    self._rendering(),
                    self.config.drain_seconds,
                )
            while (self._live() or self._rendering()) and time.monotonic() < deadline and not stop_now_requested():
                await asyncio.sleep(DRAIN_POLL)
            if self._rendering() and not stop_now_requested():
                log.warning(
                    "replica %s: %d render job(s) did not end in time; they go with it", self.id, self._rendering()
                )
            if self._live():
                reason = (
                    f"replica {self.id}: the service is stopping"
                    if stop_now_requested()
                    else f"replica {self.id} was removed: its sessions had {self.config.drain_seconds:g} s to end "
                    "and did not"
                )
                log.warning("%s", reason)
                await self.service.end_sessions()  # recordings finished, playback told, before the sockets close
                await self._close_websockets(1001, reason)
        await self._close()

    async def _close(self) -> None:
        """Stop what this replica started, as far as its start got: its HTTP client and server, then its service."""
        self._closed = True
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.service.close()

    # -- the replica's own figures and routes -----------------------------------------------

    def figures(self) -> dict[str, Any]:
        """This replica: its id, node address and process, its capacity (the engine's admission) and use, and its render
        queue."""
        return {
            "replica": {"id": self.id, "url": f"http://{self.netloc}", "pid": os.getpid()},
            **service_figures(self.service, self.draining, self.failure is not None),
        }

    def _live(self) -> int:
        return live_sessions(self.service)

    def _rendering(self) -> int:
        """Render jobs queued or running here (0 when it takes none)."""
        if self.service.renders is None:
            return 0
        counts = self.service.renders.counts()
        return counts["queued"] + counts["running"]

    def _fail(self, reason: str) -> None:
        log.error("%s", reason)
        self.failure = reason
        self.service.abort(reason)

    async def _close_websockets(self, code: int, reason: str) -> None:
        """Close every open push WebSocket saying why (clients see the code and the reason, not a dropped
        connection)."""
        if self._runner is not None:
            await close_websockets(self._runner.app, code, reason)

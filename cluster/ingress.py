"""The cluster's front door: ``POST /sessions`` through Ray Serve's HTTP proxy, placed on an engine replica with room.

    POST /sessions   the body of the single-server API (``serving.http``) -> 201 from the replica that took it,
                     with URLs of that replica (push, preview, self) and ``replica`` (its id and address);
                     503 naming the cluster's capacity when no replica has room
    GET  /sessions   every replica: capacity, live sessions, free, draining, from its last report or its
                     last answer to a POST, whichever is newer ("reported": false before either)
    GET, DELETE /sessions/{id}   forwarded to the replica that holds the session (placed by this ingress)
    /renders, /renders/{id}, /renders/{id}/video   render jobs, each on the replica with the most slack
                     (``cluster.render_ingress``), when the deployment takes them

A refusal from a replica (its report was stale, it just started draining, or it is failing) is retried on
another: each retry names the replicas that refused so far, and the router offers it to one that
has not; ``attempts`` offers at least, and on until every replica reported has refused once (the
503 then names figures each replica gave just now). Everything else about a session (push, signalling,
preview) is on the replica's own URLs, which stay the same for the session's life.
The single server's token, Host and Origin rules (``serving.access``), for every route: the token
(``Authorization: Bearer`` or ``?token=``) is required when one is set, a ``Host`` the proxy is not bound to is
refused, and a browser page of another host may not open sessions or submit jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from cluster.render_ingress import RenderRouting, error
from cluster.reports import REPORTED, summary
from engine.nesting import load_json
from serving.access import Access
from serving.api import MAX_BODY_DEPTH, ErrorKind

ATTEMPTS = 3
"""Offers of one POST to replicas before the answer may be 503 (more while a reported replica has not refused)."""
STARTED_WAIT = 2.0
"""Seconds a request waits for the first engine replica before it is answered 503 (the engines are warming up)."""
WARMUP_RETRY_AFTER = 10
"""Seconds a client is told to wait (Retry-After) while no engine replica has started yet."""
HOLDERS_KEPT = 100_000
"""Sessions whose replica the ingress remembers for GET and DELETE through the proxy (the oldest forgotten first)."""


class SessionsIngress:
    """The Serve deployment class of ``/sessions`` (and ``/renders``): places sessions through the engine deployment's
    handle, render jobs on the replicas' own HTTP servers; ``upload_mb`` bounds a job's upload (None: the deployment
    takes no render jobs)."""

    async def __init__(
        self,
        engines: Any,
        token: str | None,
        bound: tuple[str, int],
        attempts: int = ATTEMPTS,
        upload_mb: float | None = None,
    ) -> None:
        self.engines, self.attempts = engines, attempts
        self.renders = RenderRouting(token, upload_mb)
        self.access = Access.bound(bound, token)
        self.placed = 0
        self.refused = 0
        self.token = token
        self.holders: dict[str, str] = {}
        """Session id -> the URL of the replica that took it (for GET and DELETE through the proxy)."""
        self.answered: dict[str, tuple[int, dict[str, Any]]] = {}
        """Replica id -> (the seq of its report current then, its figures as a report has them) from its last answer
        to a POST."""
        self.started = asyncio.ensure_future(self._first_call())
        """Done once an engine replica answered: the handle's router starts with its first call, and has the reports
        from then on; until then (the engines warm up) requests are answered 503 with Retry-After."""

    async def _first_call(self) -> None:
        await self.engines.figures.remote()

    async def _started(self) -> bool:
        """Whether an engine replica has answered, waiting STARTED_WAIT s for one that is about to."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.started), STARTED_WAIT)
        return self.started.done()

    async def __call__(self, request: Request) -> Response:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        path = request.url.path[len(request.scope.get("root_path", "")) :].rstrip("/") or "/"
        if path.startswith(("/sessions", "/renders")) and not await self._started():
            return error(
                "the engine replicas are starting (each warms up its engine); try again shortly",
                ErrorKind.UNAVAILABLE,
                {"Retry-After": str(WARMUP_RETRY_AFTER)},
            )
        if path == "/sessions" and request.method == "POST":
            return await self.create(await request.body())
        if path == "/sessions" and request.method == "GET":
            replicas = self.replicas()
            return JSONResponse(
                {
                    "replicas": replicas,
                    "capacity": cluster_capacity(replicas),
                    "placed": self.placed,
                    "refused": self.refused,
                }
            )
        if path.startswith("/sessions/") and request.method in ("GET", "DELETE"):
            return await self.forward(request.method, path.removeprefix("/sessions/"))
        if path == "/renders" or path.startswith("/renders/"):
            return await self.renders.route(request, path)
        return error(
            "the cluster answers POST and GET /sessions, GET and DELETE /sessions/{id}, and /renders; a session's "
            "other routes are on its replica (its urls)",
            ErrorKind.NOT_FOUND,
        )

    async def forward(self, method: str, session_id: str) -> Response:
        """GET or DELETE ``/sessions/{id}`` on the replica that holds the session; 404 for one this ingress did not
        place."""
        holder = self.holders.get(session_id)
        if holder is None:
            return error(f"no session {session_id!r} was placed through this proxy", ErrorKind.NOT_FOUND)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with aiohttp.ClientSession() as http:
                async with http.request(method, f"{holder}/sessions/{session_id}", headers=headers) as response:
                    body, status, kind = await response.read(), response.status, response.content_type
        except aiohttp.ClientError as exc:
            text = f"session {session_id!r}: its replica {holder} does not answer ({exc})"
            return error(text, ErrorKind.BAD_GATEWAY)
        if method == "DELETE" and status in (200, 404):
            self.holders.pop(session_id, None)
        return Response(body, status_code=status, media_type=kind)

    async def create(self, body: bytes) -> Response:
        """Offer the session to replicas (the router ranks them by reported room) until one takes it."""
        try:
            load_json(body, MAX_BODY_DEPTH, "the request body")  # nested 100k deep: a 400, never a RecursionError
        except ValueError as exc:
            return error(f"POST /sessions takes JSON: {exc}", ErrorKind.INVALID)
        refusals: dict[str, dict[str, Any]] = {}
        tries = 0
        while tries < self.attempts or (set(REPORTED) - set(refusals) and tries < self.attempts + len(REPORTED)):
            tries += 1
            reply = await self.engines.create.remote(body, sorted(refusals))
            replica = reply["replica"]["id"]
            self.answered[replica] = (REPORTED.get(replica, {}).get("seq", 0), summary(reply))
            if not refusal(reply["status"]):
                if reply["status"] == 201:
                    self.placed += 1
                    created = json.loads(reply["body"])
                    self.holders[created["id"]] = reply["replica"]["url"]
                    if len(self.holders) > HOLDERS_KEPT:
                        del self.holders[next(iter(self.holders))]
                    return JSONResponse({**created, "replica": reply["replica"]}, status_code=201)
                return Response(
                    reply["body"],
                    status_code=reply["status"],
                    media_type="application/json" if reply["json"] else "text/plain",
                )
            self.refused += 1
            refusals[replica] = reply["capacity"]
        return error(full_message({**self.replicas(), **refusals}), ErrorKind.ADMISSION)

    def replicas(self) -> dict[str, dict[str, Any]]:
        """Each replica the router routes to, as its last report or its last answer here says, whichever is newer."""
        for gone in set(self.answered) - set(REPORTED):
            del self.answered[gone]
        newest = {}
        for replica, report in REPORTED.items():
            seq, answer = self.answered.get(replica, (-1, None))
            if answer is not None and report.get("seq", 0) <= seq:
                newest[replica] = answer
            else:
                newest[replica] = report or {"reported": False}
        return newest

    def _refuse(self, request: Request) -> Response | None:
        """400/401/403 for a request the token, Host or Origin rules do not let in (``serving.access``)."""
        refusal = self.access.check(request.method, request.headers, request.query_params.get("token", ""))
        return None if refusal is None else error(refusal.text, ErrorKind.of_status(refusal.status))


def refusal(status: int) -> bool:
    """Whether a replica's answer to a POST refuses it for reasons of its own (full, draining, failed: 503), so
    another replica may take it; any other answer is the client's."""
    return status == 503


def cluster_capacity(replicas: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The replicas' reports summed: sessions admitted in all, live, free, and how many replicas reported."""
    return {
        "replicas": len(replicas),
        "admitted": sum(r.get("admitted", 0) for r in replicas.values()),
        "live": sum(r.get("live", 0) for r in replicas.values()),
        "free": sum(r.get("free", 0) for r in replicas.values()),
    }


def full_message(replicas: dict[str, dict[str, Any]]) -> str:
    """The 503 text: the cluster's capacity and each replica's, and what to do."""
    total = cluster_capacity(replicas)
    each = ", ".join(
        f"{rid}: {r.get('live', 0)} of {r.get('admitted', 0)}{' (draining)' if r.get('draining') else ''}"
        for rid, r in sorted(replicas.items())
    )
    return (
        f"the cluster is full: {total['replicas']} engine replica(s) serve {total['live']} live session(s) of the "
        f"{total['admitted']} they admit ({each}); end a session, or add a GPU (one more replica)"
    )

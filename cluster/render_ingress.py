"""The cluster's render jobs: ``/renders`` through Ray Serve's HTTP proxy, each job on the replica with the most slack.

    POST   /renders[?avatar=...]   the single server's request (``serving.render_routes``), forwarded as it came (its
                                   query string, Content-Type and body, with the cluster's token) to the engine replica
                                   with the most slack: the fewest jobs queued and running, then the most free live
                                   capacity, as every replica's ``GET /replica`` says just now. A replica whose queue
                                   is full or that is draining is passed over; one that answers 503 anyway (it filled
                                   up meanwhile, started draining, or failed) hands the job to the next; any other
                                   answer is the client's. 202: the replica's job, with ``urls`` on this proxy and
                                   ``replica`` (its id and address)
    GET    /renders                every replica's jobs (urls on this proxy) and their queues summed, and each one's
    GET    /renders/{id}, GET /renders/{id}/video (streamed through), DELETE /renders/{id}
                                   forwarded to the replica that holds the job

The replicas' addresses are those the capacity router has from their reports (``cluster.reports``). A job's progress
and its video go through this proxy like its submission: a client needs no address but the proxy's. The upload is
bounded here as on the single server: refused from its Content-Length before it is read, or once it reads past the
bound; it is held (at most that) until a replica takes it, so a refusal can hand it to the next.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import yarl
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from cluster.reports import REPORTED
from serving.api import ErrorKind, SessionError, error_body

JOBS_KEPT = 100_000
"""Render jobs whose replica the ingress remembers (the oldest forgotten first; a forgotten one is looked up again)."""
FIGURES_TIMEOUT = aiohttp.ClientTimeout(total=3.0)
"""How long a replica has to say its figures before a job is placed without it."""
FORWARD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=120.0)
"""A forwarded request: no bound on the whole (a video of tens of MB), but on connecting and on every read (a replica
decodes a long upload before it answers)."""
CHUNK = 1 << 16
STARTING_RETRY_AFTER = 5


class RenderRouting:
    """The ingress's ``/renders``: places jobs on replicas, remembers which holds each, forwards the rest to it."""

    def __init__(self, token: str | None, upload_mb: float | None) -> None:
        self.token, self.upload_mb = token, upload_mb
        self.holders: dict[str, tuple[str, str]] = {}
        """Job id -> (replica id, the replica's URL)."""
        self.sending: Counter[str] = Counter()
        """Replica id -> jobs offered to it and not answered yet (its figures do not count them)."""
        self.placed = 0
        self.refused = 0

    @property
    def headers(self) -> dict[str, str]:
        """The cluster's token, which every replica requires too."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def route(self, request: Request, path: str) -> Response:
        """Answer a request whose path is ``/renders`` or below it."""
        if self.upload_mb is None:
            return error("this cluster takes no render jobs (deploy it with --renders DIR)", ErrorKind.NOT_FOUND)
        method, parts = request.method, path.split("/")[2:]
        try:
            if not parts and method == "POST":
                return await self.submit(request)
            if not parts and method == "GET":
                return await self.listing(request)
            if len(parts) == 1 and method in ("GET", "DELETE"):
                return await self.one(request, method, parts[0])
            if len(parts) == 2 and parts[1] == "video" and method == "GET":
                return await self.video(parts[0])
        except SessionError as exc:
            return error(str(exc), exc.kind)
        return error(
            "the cluster answers POST and GET /renders, GET and DELETE /renders/{id}, GET /renders/{id}/video",
            ErrorKind.NOT_FOUND,
        )

    async def submit(self, request: Request) -> Response:
        """Offer the job to the replicas in ``ranked`` order until one answers other than 503."""
        body = await read_upload(request, self.upload_mb)
        ranked, passed_over = await self.ranked()
        refusals: dict[str, str] = dict(passed_over)
        for replica, url in ranked:
            self.sending[replica] += 1
            try:
                status, answer, kind = await self.forward_post(request, url, body)
            except aiohttp.ClientError as exc:
                refusals[replica] = f"does not answer ({exc})"
                continue
            finally:
                self.sending[replica] -= 1
            if status == 202:
                self.placed += 1
                job = json.loads(answer)
                self.remember(job["id"], replica, url)
                return JSONResponse(proxied(request, job, replica, url), status_code=202)
            if status != 503:
                return Response(answer, status_code=status, media_type=kind)
            self.refused += 1
            refusals[replica] = refusal_text(answer)
        if not refusals:
            return error(
                "no engine replica has reported its address yet (they are starting); try again shortly",
                ErrorKind.UNAVAILABLE,
                {"Retry-After": str(STARTING_RETRY_AFTER)},
            )
        each = "; ".join(f"{replica}: {text}" for replica, text in sorted(refusals.items()))
        return error(f"no engine replica takes the render job now ({each}); retry later", ErrorKind.ADMISSION)

    async def ranked(self) -> tuple[list[tuple[str, str]], dict[str, str]]:
        """The replicas a new job is offered to, in order (id, URL), and why the others are passed over (id -> why)."""
        figures, urls, passed_over = {}, {}, {}
        for replica, url, answer in await self.ask_every_replica("/replica"):
            urls[replica] = url
            if isinstance(answer, str):
                passed_over[replica] = answer
            elif answer["renders"] is None:
                passed_over[replica] = "takes no render jobs"
            elif answer["capacity"]["draining"]:
                passed_over[replica] = "draining for removal"
            elif answer["renders"]["running"] and answer["renders"]["queued"] >= answer["renders"]["limit"]:
                queue = answer["renders"]
                passed_over[replica] = f"its queue is full ({queue['queued']} waiting beside the one running)"
            else:
                figures[replica] = answer
        return [(replica, urls[replica]) for replica in render_order(figures, self.sending)], passed_over

    async def ask_every_replica(self, path: str) -> list[tuple[str, str, dict[str, Any] | str]]:
        """Every reported replica's (id, URL, its JSON answer to ``GET path`` or why there is none), asked at once."""
        known = replica_urls(REPORTED)
        async with aiohttp.ClientSession(timeout=FIGURES_TIMEOUT) as http:
            said = await asyncio.gather(*(self.ask(http, url, path) for url in known.values()))
        return [(replica, url, answer) for (replica, url), answer in zip(known.items(), said)]

    async def ask(self, http: aiohttp.ClientSession, url: str, path: str) -> dict[str, Any] | str:
        """The replica at ``url``'s JSON answer to ``GET path``, or why there is none."""
        try:
            async with http.get(f"{url}{path}", headers=self.headers) as response:
                if response.status != 200:
                    return f"answered {response.status} for {path}"
                return await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"does not answer ({exc or type(exc).__name__})"

    async def forward_post(self, request: Request, url: str, body: bytes) -> tuple[int, bytes, str]:
        """``POST /renders`` on the replica at ``url`` as the client sent it: status, body, content type."""
        headers = dict(self.headers)
        if "content-type" in request.headers:
            headers["Content-Type"] = request.headers["content-type"]
        query = request.url.query
        target = yarl.URL(f"{url}/renders" + (f"?{query}" if query else ""), encoded=True)
        async with aiohttp.ClientSession(timeout=FORWARD_TIMEOUT) as http:
            async with http.post(target, data=body, headers=headers) as response:
                return response.status, await response.read(), response.content_type

    async def listing(self, request: Request) -> Response:
        """Every replica's jobs, their urls on this proxy, and the queues: summed, and each replica's."""
        jobs, queues = [], {}
        for replica, url, answer in await self.ask_every_replica("/renders"):
            if isinstance(answer, str):
                queues[replica] = {"error": answer}
                continue
            queues[replica] = answer["queue"]
            for job in answer["renders"]:
                self.remember(job["id"], replica, url)
                jobs.append(proxied(request, job, replica, url))
        summed: Counter[str] = Counter()
        for queue in queues.values():
            summed.update({k: v for k, v in queue.items() if isinstance(v, int)})
        return JSONResponse(
            {"renders": jobs, "queue": dict(summed), "replicas": queues, "placed": self.placed, "refused": self.refused}
        )

    async def one(self, request: Request, method: str, job_id: str) -> Response:
        """GET (with its ``wait``) or DELETE ``/renders/{id}`` on the replica that holds the job; the job's urls on this
        proxy."""
        replica, url = await self.holder(job_id)
        try:
            async with aiohttp.ClientSession(timeout=FORWARD_TIMEOUT) as http:
                params = {"wait": request.query_params["wait"]} if "wait" in request.query_params else None
                target = f"{url}/renders/{job_id}"
                async with http.request(method, target, params=params, headers=self.headers) as response:
                    status, body, kind = response.status, await response.read(), response.content_type
        except aiohttp.ClientError as exc:
            raise unreachable(job_id, url, exc) from None
        if status == 404 or (method == "DELETE" and status == 200):
            self.holders.pop(job_id, None)
        if status != 200:
            return Response(body, status_code=status, media_type=kind)
        return JSONResponse(proxied(request, json.loads(body), replica, url))

    async def video(self, job_id: str) -> Response:
        """The finished MP4 from the replica that holds the job, streamed through as it comes."""
        _, url = await self.holder(job_id)
        http = aiohttp.ClientSession(timeout=FORWARD_TIMEOUT)
        try:
            response = await http.get(f"{url}/renders/{job_id}/video", headers=self.headers)
        except aiohttp.ClientError as exc:
            await http.close()
            raise unreachable(job_id, url, exc) from None
        if response.status != 200:
            body, status, kind = await response.read(), response.status, response.content_type
            await http.close()
            return Response(body, status_code=status, media_type=kind)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_chunked(CHUNK):
                    yield chunk
            finally:
                await http.close()

        passed = {k: response.headers[k] for k in ("Content-Length", "Content-Disposition") if k in response.headers}
        return StreamingResponse(chunks(), media_type="video/mp4", headers=passed)

    async def holder(self, job_id: str) -> tuple[str, str]:
        """(replica id, URL) of the replica that holds the job: remembered, or asked of every replica (a job placed
        before this ingress started, or forgotten); SessionError(not_found) when none holds it."""
        if job_id in self.holders:
            return self.holders[job_id]
        for replica, url, answer in await self.ask_every_replica(f"/renders/{job_id}"):
            if not isinstance(answer, str):
                self.remember(job_id, replica, url)
                return replica, url
        raise SessionError(f"no render job {job_id!r} on any engine replica", ErrorKind.NOT_FOUND)

    def remember(self, job_id: str, replica: str, url: str) -> None:
        """Keep the job's replica (at most JOBS_KEPT jobs, the oldest forgotten first)."""
        self.holders[job_id] = (replica, url)
        if len(self.holders) > JOBS_KEPT:
            del self.holders[next(iter(self.holders))]


def render_order(figures: Mapping[str, Mapping[str, Any]], sending: Mapping[str, int]) -> list[str]:
    """The replicas in the order a new job is offered to them: the fewest jobs queued, running and being sent to it
    first (a job waits for every one ahead of it, whole), then the most free live capacity (more of its loop is
    slack, and fewer live sessions share the GPU with the job)."""

    def key(replica: str) -> tuple[int, int]:
        queue, capacity = figures[replica]["renders"], figures[replica]["capacity"]
        return queue["queued"] + queue["running"] + sending.get(replica, 0), -capacity["free"]

    return sorted(figures, key=key)


def replica_urls(reported: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Replica id -> its HTTP URL, of every replica whose report has one."""
    return {replica: report["url"] for replica, report in reported.items() if "url" in report}


def proxied(request: Request, job: dict[str, Any], replica: str, url: str) -> dict[str, Any]:
    """A replica's job as this proxy answers it: its urls on the proxy, and the replica that holds it."""
    base = f"{str(request.base_url).rstrip('/')}/renders/{job['id']}"
    return {**job, "urls": {"self": base, "video": f"{base}/video"}, "replica": {"id": replica, "url": url}}


def unreachable(job_id: str, url: str, exc: Exception) -> SessionError:
    """The 502 of a job whose replica does not answer (it failed, or Serve removed it: its jobs went with it)."""
    return SessionError(f"render {job_id}: its replica {url} does not answer ({exc})", ErrorKind.BAD_GATEWAY)


def refusal_text(body: bytes) -> str:
    """What a replica's 503 says (its error message, or the body as text)."""
    try:
        return json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


async def read_upload(request: Request, upload_mb: float) -> bytes:
    """The request's body, at most ``upload_mb`` (refused from its Content-Length before it is read, or once it reads
    past it): SessionError(too_large)."""
    limit = int(upload_mb * 1024 * 1024)
    too_big = SessionError(f"the upload is over this service's {upload_mb:g} MB", ErrorKind.TOO_LARGE)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_big
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        parts.append(chunk)
    return b"".join(parts)


def error(message: str, kind: ErrorKind, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer in the API's one shape (``serving.api.error_body``), with the kind's status."""
    return JSONResponse(error_body(message, kind), status_code=kind.status, headers=headers)

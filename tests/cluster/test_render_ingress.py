"""Render jobs through the cluster's ingress, without Ray: the ingress (``SessionsIngress``, served by uvicorn as
Serve's proxy would reach it) in front of two real replicas' HTTP servers on loopback (``cluster.replica.replica_app``
over a real service of the synthetic runtime, whose jobs make frames at ten times real time) and one replica that is
gone.

What Ray adds (the reports that carry each replica's URL to ``cluster.reports.REPORTED``) is set here as the router
sets it; tests/cluster/test_cpu_engine.py goes through a real Ray cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import wave
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

pytest.importorskip("ray")
uvicorn = pytest.importorskip("uvicorn")
av = pytest.importorskip("av")
from starlette.requests import Request  # noqa: E402

from cluster import reports  # noqa: E402
from cluster.ingress import SessionsIngress  # noqa: E402
from cluster.render_ingress import RenderRouting, render_order  # noqa: E402
from cluster.replica import replica_app, replica_renders, service_figures  # noqa: E402
from serving.http import app_runner  # noqa: E402
from serving.processes import ServiceOptions  # noqa: E402
from serving.renders import RenderLimits  # noqa: E402
from serving.service import Service  # noqa: E402
from tests.streaming.conftest import free_port  # noqa: E402

TOKEN = "t0k3n"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UPLOAD_MB = 1.0
RUNTIME = "tests.streaming.synthetic_runtime:build"


def wav_bytes(seconds: float, rate: int = 8_000) -> bytes:
    """A 220 Hz tone as a WAV file's bytes (8 kHz: 40 s fit the 1 MB bound)."""
    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((0.5 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16).tobytes())
    return out.getvalue()


@contextlib.asynccontextmanager
async def replica(folder: Path, name: str) -> AsyncIterator[tuple[Service, str]]:
    """A replica's HTTP side as ``EngineReplica`` serves it (the cluster's token, its bound address, ``/replica``),
    over a real service taking render jobs (one waiting beside the one running)."""
    limits = replica_renders(asdict(RenderLimits(folder, queue=1, max_mb=UPLOAD_MB)), name)
    service = Service(ServiceOptions(workers=1, runtime=RUNTIME, renders=limits))
    await service.start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def figures() -> dict:
        return {"replica": {"id": name, "url": url, "pid": os.getpid()}, **service_figures(service)}

    runner = app_runner(replica_app(service, TOKEN, "", ("127.0.0.1", port), figures))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield service, url
    finally:
        await runner.cleanup()
        await service.close()


class Engines:
    """Stands in for the engine deployment's handle, which the ingress calls once (to start its router); render jobs
    never go through it."""

    class figures:
        @staticmethod
        async def remote() -> None:
            return None


@contextlib.asynccontextmanager
async def ingress() -> AsyncIterator[str]:
    """The ingress on a free loopback port, served as an ASGI app (Serve's proxy hands it Starlette requests too)."""
    port = free_port()
    served = object.__new__(SessionsIngress)
    await served.__init__(Engines(), TOKEN, ("127.0.0.1", port), upload_mb=UPLOAD_MB)

    async def app(scope, receive, send) -> None:
        response = await served(Request(scope, receive))
        await response(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def raw_post(port: int, length: int) -> bytes:
    """A POST that announces ``length`` bytes and sends none: the status line of what it is answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST /renders?avatar=anna HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    return line


async def until_done(http: aiohttp.ClientSession, url: str) -> dict:
    for _ in range(300):
        job = await (await http.get(url, headers=AUTH)).json()
        if job["state"] in ("done", "failed", "cancelled"):
            return job
        await asyncio.sleep(0.1)
    raise AssertionError(f"the job did not finish: {job}")


def test_jobs_go_to_the_replica_with_the_most_slack_and_everything_about_them_goes_through_the_proxy(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as stack:
            (a, url_a), (b, url_b) = await asyncio.gather(
                stack.enter_async_context(replica(tmp_path, "a")), stack.enter_async_context(replica(tmp_path, "b"))
            )
            services, urls = {"a": a, "b": b}, {"a": url_a, "b": url_b}
            reports.REPORTED.update({name: {"url": url} for name, url in urls.items()})
            reports.REPORTED["gone"] = {"url": f"http://127.0.0.1:{free_port()}"}  # a replica that does not answer
            stack.callback(reports.REPORTED.clear)
            base = await stack.enter_async_context(ingress())
            http = await stack.enter_async_context(aiohttp.ClientSession())

            async def post(seconds: float, **params: str) -> tuple[int, dict]:
                answer = await http.post(
                    f"{base}/renders", params={"avatar": "anna", **params}, data=wav_bytes(seconds), headers=AUTH
                )
                return answer.status, await answer.json()

            assert (await http.post(f"{base}/renders?avatar=anna", data=b"x")).status == 401, "the token, as /sessions"
            port = int(base.rsplit(":", 1)[1])
            assert b" 413 " in await raw_post(port, 10 * 1024 * 1024), "refused from its Content-Length, unread"

            async def chunked() -> AsyncIterator[bytes]:
                for _ in range(17):
                    yield b"\0" * (1 << 16)

            over = await http.post(f"{base}/renders?avatar=anna", data=chunked(), headers=AUTH)
            assert over.status == 413 and (await over.json())["kind"] == "too_large"

            jobs = [await post(40.0), await post(40.0), await post(1.0), await post(1.0)]
            assert [status for status, _ in jobs] == [202] * 4, jobs
            on = [job["replica"]["id"] for _, job in jobs]
            assert set(on[:2]) == {"a", "b"} and set(on[2:]) == {"a", "b"}, f"each went where fewer jobs were: {on}"
            for _, job in jobs:
                assert job["urls"] == {
                    "self": f"{base}/renders/{job['id']}",
                    "video": f"{base}/renders/{job['id']}/video",
                }
            status, full = await post(1.0)
            assert status == 503 and full["kind"] == "admission", full
            assert full["error"].count("its queue is full") == 2 and "gone: does not answer" in full["error"], full

            listed = await (await http.get(f"{base}/renders", headers=AUTH)).json()
            assert sorted(j["id"] for j in listed["renders"]) == sorted(job["id"] for _, job in jobs)
            assert all(j["urls"]["self"].startswith(base) for j in listed["renders"])
            queue = listed["queue"]
            assert (queue["limit"], queue["queued"], queue["running"]) == (2, 2, 2), queue
            assert "error" in listed["replicas"]["gone"] and listed["replicas"]["a"]["running"] == 1

            first, behind = jobs[0][1], next(job for _, job in jobs[2:] if job["replica"] == jobs[0][1]["replica"])
            cancelled = await http.delete(first["urls"]["self"], headers=AUTH)
            assert cancelled.status == 200 and (await cancelled.json())["state"] == "cancelled"
            done = await (await http.get(f"{behind['urls']['self']}?wait=25", headers=AUTH)).json()
            assert done["state"] == "done", f"wait reaches the replica: the answer comes once the job ends: {done}"
            assert done["frames_done"] == 25, "the job behind it ran once the slot was free"
            video = await http.get(behind["urls"]["video"], headers=AUTH)
            data = await video.read()
            assert video.status == 200 and video.content_type == "video/mp4"
            assert int(video.headers["Content-Length"]) == len(data)
            with av.open(io.BytesIO(data)) as container:
                assert sum(1 for _ in container.decode(video=0)) == 25, "the replica's MP4, streamed through whole"
            holder = behind["replica"]["id"]
            assert [p.name for p in (tmp_path / f"replica-{holder}").iterdir()] == [f"render-{behind['id']}.mp4"]

            missing = await http.post(f"{base}/renders", params={"avatar": "nobody"}, data=wav_bytes(1.0), headers=AUTH)
            assert missing.status == 404 and "no avatar 'nobody'" in (await missing.json())["error"], "the client's"
            for _, job in jobs[1:]:
                assert (await http.delete(job["urls"]["self"], headers=AUTH)).status == 200
            gone = await http.get(behind["urls"]["self"], headers=AUTH)
            assert gone.status == 404 and (await gone.json())["kind"] == "not_found"

            said = {name: await (await http.get(f"{url}/replica", headers=AUTH)).json() for name, url in urls.items()}
            offered = render_order(said, {})[0]
            services[offered].refusing = f"replica {offered} is draining"  # its figures do not say so yet
            status, taken = await post(1.0)
            assert status == 202 and taken["replica"]["id"] != offered, "a refusal (503) hands the job to the next one"
            assert (await until_done(http, taken["urls"]["self"]))["state"] == "done"
            assert (await http.delete(taken["urls"]["self"], headers=AUTH)).status == 200
            listed = await (await http.get(f"{base}/renders", headers=AUTH)).json()
            assert (listed["placed"], listed["refused"]) == (5, 1), listed

    asyncio.run(scenario())


def test_a_job_waits_least_where_fewest_jobs_are_ahead_of_it_then_where_most_live_capacity_is_free() -> None:
    def figures(jobs: int, free: int) -> dict:
        return {
            "renders": {"queued": max(0, jobs - 1), "running": min(jobs, 1), "limit": 4},
            "capacity": {"free": free},
        }

    replicas = {"a": figures(0, 1), "b": figures(0, 3), "c": figures(1, 9)}
    assert render_order(replicas, {}) == ["b", "a", "c"]
    assert render_order(replicas, {"b": 1}) == ["a", "c", "b"], "a job being sent counts before the replica says so"


def test_a_cluster_that_takes_no_jobs_says_so() -> None:
    request = Request({"type": "http", "method": "GET", "path": "/renders", "headers": [], "query_string": b""})
    answer = asyncio.run(RenderRouting(None, None).route(request, "/renders"))
    assert answer.status_code == 404 and b"takes no render jobs" in answer.body

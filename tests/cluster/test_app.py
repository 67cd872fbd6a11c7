"""The Serve application on a real local Ray cluster with two fake GPUs: two engine replicas, each a real service
(engine core and output worker processes) running the synthetic runtime (tests/streaming/synthetic_runtime.py).

One cluster and one application serve the whole module (Serve starts in about 15 s on two cores); the tests
run in order, and each leaves two healthy replicas and no live session behind it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from cluster.app import APP_NAME, ClusterOptions, application  # noqa: E402
from cluster.replica import ReplicaConfig  # noqa: E402
from tests.streaming.conftest import free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]
RUNTIME = "tests.streaming.synthetic_runtime:build"
DRAIN_SECONDS = 30.0


def options(port: int, replicas: int = 2) -> ClusterOptions:
    replica = ReplicaConfig(service={"device": "cpu", "workers": 1, "runtime": RUNTIME}, drain_seconds=DRAIN_SECONDS, health_timeout=2.0)
    return ClusterOptions(replica=replica, replicas=replicas, http=("127.0.0.1", port), health_period=1.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster (2 CPUs, 2 fake GPUs), Serve on a free port, the application deployed; its base URL."""
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}, logging_level="WARNING")
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application(options(port)), name=APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def run(coroutine):
    return asyncio.run(coroutine)


async def post(http: aiohttp.ClientSession, base: str, body: dict | None = None) -> tuple[int, dict | str]:
    async with http.post(f"{base}/sessions", json=body or {"avatar": "anna"}) as response:
        return response.status, (await response.json() if response.status == 201 else await response.text())


async def until(condition, seconds: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"{what}: not met in {seconds} s")


async def state(http: aiohttp.ClientSession, session: dict) -> str | None:
    """The session's state as its replica reports it; None when the replica does not answer."""
    try:
        async with http.get(session["urls"]["self"], timeout=aiohttp.ClientTimeout(total=3)) as response:
            return (await response.json())["state"] if response.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


async def delete_all(http: aiohttp.ClientSession, sessions: list[dict]) -> None:
    for session in sessions:
        async with http.delete(session["urls"]["self"]) as response:
            assert response.status in (200, 404)


async def push_ready(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
    assert (await ws.receive_json(timeout=10))["type"] == "ready"


def test_sessions_are_placed_by_capacity_stick_to_their_replica_and_the_cap_holds(cluster: str) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            made = []
            while True:
                status, body = await post(http, cluster)
                if status != 201:
                    break
                made.append(body)
                assert len(made) <= 16, "the cluster admitted more sessions than any report allows"
            assert status == 503 and "the cluster is full: 2 engine replica(s)" in body, body
            per_replica: dict[str, list[dict]] = {}
            for session in made:
                per_replica.setdefault(session["replica"]["id"], []).append(session)
            assert len(per_replica) == 2, "sessions were not spread over both replicas"
            reported = (await (await http.get(f"{cluster}/sessions")).json())["replicas"]
            for replica_id, sessions in per_replica.items():
                assert len(sessions) == reported.get(replica_id, {}).get("admitted"), (replica_id, len(sessions), reported, body)
                assert f"{replica_id}: {len(sessions)} of {len(sessions)}" in body
            for session in made:
                assert session["urls"]["push"].startswith(session["replica"]["url"].replace("http://", "ws://"))
                assert await state(http, session) == "live"
            first = made[0]
            async with http.ws_connect(first["urls"]["push"]) as ws:
                await push_ready(ws)
                await ws.send_json({"type": "controls", "yaw": 3})
                assert await ws.receive_json(timeout=10) == {"type": "controls", "applied": {"yaw": 3.0}}
            await delete_all(http, made)
            status, again = await post(http, cluster)
            assert status == 201, again
            await delete_all(http, [again])

    run(scenario())

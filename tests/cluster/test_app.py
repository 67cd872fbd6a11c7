"""The Serve application on a real local Ray cluster with two fake GPUs: two engine replicas, each a real service
(engine core and output worker processes) running the synthetic runtime (tests/streaming/synthetic_runtime.py).

One cluster and one application serve the whole module (Serve starts in about 15 s on two cores); the tests
run in order, and each leaves two healthy replicas and no live session behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import av
import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from cluster.app import APP_NAME  # noqa: E402
from cluster.ray_files import RayFiles  # noqa: E402
from tests.serving.test_renders import wav_bytes  # noqa: E402
from tests.streaming.conftest import free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]
RUNTIME = "tests.cluster.small_runtime:build"
DRAIN_SECONDS = 30.0


def config(port: int, renders: Path, replicas: int = 2) -> dict:
    """A serve config (as cluster/serve.yaml) for two CPU replicas of the synthetic runtime on loopback, taking render
    jobs into ``renders``."""
    args = {
        "http": f"127.0.0.1:{port}",
        "device": "cpu",
        "workers": 1,
        "runtime": RUNTIME,
        "replicas": 2,
        "drain_seconds": DRAIN_SECONDS,
        "health_timeout": 2,
        "health_period": 1,
        "renders": {"folder": str(renders), "queue": 1},
    }
    app = {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": "cluster.app:build",
        "args": args,
        "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}},
        "deployments": [{"name": "engine", "num_replicas": replicas}],
    }
    return {"http_options": {"host": "127.0.0.1", "port": port}, "applications": [app]}


def deploy(tmp: Path, dashboard: str, port: int, replicas: int) -> None:
    """``serve deploy`` of ``config`` (JSON is YAML), through the dashboard's REST API as an operator would."""
    path = tmp / f"serve-{replicas}.yaml"
    path.write_text(json.dumps(config(port, tmp / "renders", replicas)))
    subprocess.run(
        [sys.executable, "-m", "ray.serve.scripts", "deploy", str(path), "-a", dashboard],
        check=True,
        timeout=90,
        capture_output=True,
    )


def running() -> bool:
    status = serve.status().applications.get(APP_NAME)
    return status is not None and status.status == "RUNNING"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A local Ray cluster (2 CPUs, 2 fake GPUs) with its dashboard (``serve deploy`` talks to it), the application
    deployed from a serve config; the proxy's base URL and how to deploy again. Its files are kept apart, as
    ``apps.serve --ray`` keeps them, and removed at the end, once every replica has removed its service's folder."""
    dashboard_port, port = free_port(), free_port()
    files = RayFiles()
    context = files.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard_port,
        logging_level="WARNING",
    )
    dashboard = f"http://{context.dashboard_url}"
    tmp = tmp_path_factory.mktemp("serve")
    try:
        deploy(tmp, dashboard, port, 2)
        deadline = time.monotonic() + 120
        while not running():
            assert time.monotonic() < deadline, f"the application did not start: {serve.status()}"
            time.sleep(0.5)
        yield Cluster(
            f"http://127.0.0.1:{port}", lambda replicas: deploy(tmp, dashboard, port, replicas), tmp / "renders"
        )
    finally:
        serve.delete(APP_NAME)  # the replicas stop their services (and remove their folders) before Ray goes
        serve.shutdown()
        ray.shutdown()
        left = sorted(path.name for path in files.path.glob("ditto-svc-*"))
        files.remove()
    assert left == [], "a stopped replica left its service's folder behind"


@dataclass
class Cluster:
    base: str
    deploy: Callable[[int], None]
    """Deploy the same config again with this many engine replicas."""
    renders: Path
    """The render jobs' folder (each replica's in a subfolder)."""


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
    except (TimeoutError, aiohttp.ClientError):
        return None


async def streaming(http: aiohttp.ClientSession, session: dict) -> None:
    """Wait until the session's replica has released a frame of it (its output worker encodes it)."""

    async def released() -> bool:
        async with http.get(session["urls"]["self"]) as response:
            return (await response.json())["counters"].get("frames_released", 0) > 0

    await until(released, 30, f"session {session['id']} streams")


async def delete_all(http: aiohttp.ClientSession, sessions: list[dict]) -> None:
    """End the sessions, each once it streams (a session ended before its worker attached its frames hangs: see the
    report of this branch)."""
    for session in sessions:
        await streaming(http, session)
        async with http.delete(session["urls"]["self"]) as response:
            assert response.status in (200, 404)


async def push_ready(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
    assert (await ws.receive_json(timeout=10))["type"] == "ready"


def test_sessions_are_placed_by_capacity_stick_to_their_replica_and_the_cap_holds_and_the_proxy_reaches_them(
    cluster: Cluster,
) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            made = []
            while True:
                status, body = await post(http, cluster.base)
                if status != 201:
                    break
                made.append(body)
                assert len(made) <= 8, "the cluster admitted more sessions than any report allows"
            assert status == 503 and "the cluster is full: 2 engine replica(s)" in body, body
            per_replica: dict[str, list[dict]] = {}
            for session in made:
                per_replica.setdefault(session["replica"]["id"], []).append(session)
            assert len(per_replica) == 2, "sessions were not spread over both replicas"
            reported = (await (await http.get(f"{cluster.base}/sessions")).json())["replicas"]
            for replica_id, sessions in per_replica.items():
                assert len(sessions) == reported.get(replica_id, {}).get("admitted"), (
                    replica_id,
                    len(sessions),
                    reported,
                    body,
                )
                assert f"{replica_id}: {len(sessions)} of {len(sessions)}" in body
            for session in made:
                assert session["urls"]["push"].startswith(session["replica"]["url"].replace("http://", "ws://"))
                assert await state(http, session) == "live"
            first, last = made[0], made[-1]
            async with http.get(f"{cluster.base}/sessions/{first['id']}") as response:
                assert response.status == 200 and (await response.json())["state"] == "live"
            await streaming(http, last)
            async with http.delete(f"{cluster.base}/sessions/{last['id']}") as response:
                assert response.status == 200, await response.text()
            assert await state(http, last) is None, "an ended session's record is dropped once DELETE answered"
            made.remove(last)
            async with http.get(f"{cluster.base}/sessions/nobody") as response:
                assert response.status == 404
            async with http.ws_connect(first["urls"]["push"]) as ws:
                await push_ready(ws)
                await ws.send_json({"type": "controls", "yaw": 3})
                assert await ws.receive_json(timeout=10) == {"type": "controls", "applied": {"yaw": 3.0}}
            await delete_all(http, made)
            status, again = await post(http, cluster.base)
            assert status == 201, again
            await delete_all(http, [again])

    run(scenario())


def test_a_voice_agent_given_the_proxy_s_address_speaks_through_its_replica_and_ends_its_session(
    cluster: Cluster,
) -> None:
    """The pipecat service's remote backend works against the proxy as against one server: its WebRTC (WHEP) and
    push socket go to the replica the answer names, its DELETE through the proxy."""
    from integrations.service_backend import ServiceBackend

    async def scenario() -> list[bytes]:
        backend, heard = ServiceBackend(cluster.base, "anna", None, {}, max_held=25), []
        await backend.open()
        try:

            async def pictured() -> bool:
                return backend.next() is not None

            await until(pictured, 30, "a picture over the replica's WHEP")
            second = np.arange(16000) / 16000
            await backend.push_audio(
                (np.sin(2 * np.pi * 220 * second) * 8000).astype("<i2").tobytes(), 16000, 1, lambda: True
            )
            segment = await backend.end_segment()

            async def spoken() -> bool:
                if (shown := backend.next()) is not None and shown.speech_audio:
                    heard.append(shown.speech_audio)
                return segment is not None and backend.shown(segment)

            await until(spoken, 30, "the segment played")
            session_id = backend.session_id
        finally:
            await backend.close()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{cluster.base}/sessions/{session_id}") as response:
                assert response.status == 404, "the proxy forwarded the DELETE: the session is gone"
        return heard

    assert run(scenario()), "the bot received speech audio with the pictures"


def test_a_render_job_through_the_proxy_is_placed_followed_downloaded_and_deleted(cluster: Cluster) -> None:
    """The whole way through Serve's proxy: the serve config's renders mapping, the job on a replica (its folder its
    own), its progress and its MP4 streamed back through the ingress, and its DELETE."""

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{cluster.base}/renders?avatar=anna", data=wav_bytes(1.0)) as response:
                assert response.status == 202, await response.text()
                job = await response.json()
            assert job["urls"]["self"] == f"{cluster.base}/renders/{job['id']}", job["urls"]

            async def done() -> bool:
                async with http.get(job["urls"]["self"]) as response:
                    return (await response.json())["state"] == "done"

            await until(done, 30, f"render {job['id']} done")
            async with http.get(job["urls"]["video"]) as response:
                assert response.status == 200 and response.content_type == "video/mp4"
                data = await response.read()
            with av.open(io.BytesIO(data)) as container:
                assert sum(1 for _ in container.decode(video=0)) == 25
            folder = cluster.renders / f"replica-{job['replica']['id']}"
            assert [p.name for p in folder.iterdir()] == [f"render-{job['id']}.mp4"]
            async with http.delete(job["urls"]["self"]) as response:
                assert response.status == 200
            assert list(folder.iterdir()) == [] and (await http.get(job["urls"]["self"])).status == 404

    run(scenario())


async def two_sessions(http: aiohttp.ClientSession, base: str) -> tuple[dict, dict]:
    """One session on each replica: once both report no live session, the router sends each new one where there is
    more room. Each replica admits what its own engine measured it can carry, so on a loaded machine one may admit
    more than the other: the sessions past the difference reach the other one, and those before it are ended."""

    async def idle() -> bool:
        now = await replicas(http, base)
        return len(now) == 2 and all(r["live"] == 0 and r["free"] > 0 for r in now.values())

    await until(idle, 30, "both replicas report no live session")
    free = {replica: report["free"] for replica, report in (await replicas(http, base)).items()}
    status_a, a = await post(http, base)
    assert status_a == 201, a
    extra: list[dict] = []
    while True:
        status_b, b = await post(http, base)
        assert status_b == 201, b
        if b["replica"]["id"] != a["replica"]["id"]:
            break
        extra.append(b)
        assert len(extra) < free[a["replica"]["id"]] - min(free.values()) + 1, (
            f"sessions kept going to one replica past its extra room: {free}"
        )
    await delete_all(http, extra)
    return a, b


async def replicas(http: aiohttp.ClientSession, base: str) -> dict[str, dict]:
    async with http.get(f"{base}/sessions") as response:
        return (await response.json())["replicas"]


async def replaced(http: aiohttp.ClientSession, base: str, gone: str) -> None:
    """Wait until two replicas report again, ``gone`` not among them."""

    async def done() -> bool:
        now = await replicas(http, base)
        return len(now) == 2 and gone not in now

    await until(done, 90, f"replica {gone} replaced")


def core_of(replica_pid: int) -> int:
    """The engine core process started by the replica process ``replica_pid``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"\nPPid:\t{replica_pid}\n" in status and b"serving.core" in cmdline:
            return int(proc.name)
    raise LookupError(f"no engine core under process {replica_pid}")


def folder_of(core: int) -> Path:
    """The service folder of the engine core ``core`` (its sockets' addresses are on its command line)."""
    command = Path(f"/proc/{core}/cmdline").read_bytes().decode(errors="replace")
    return Path(re.search(r"/tmp/(?:ditto-ray-\w+/)?ditto-svc-\w+", command).group(0))


def rings_of(pid: int) -> set[Path]:
    """The shared-memory frame rings process ``pid`` maps."""
    return {Path(path) for path in re.findall(r"/dev/shm/psm_\w+", Path(f"/proc/{pid}/maps").read_text())}


def alive(pid: int) -> bool:
    try:
        return not (Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0)
    except OSError:
        return False


async def still_served(http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse, session: dict) -> None:
    """The session answers on its push socket and its replica reports it live."""
    await ws.send_json({"type": "controls", "yaw": 1})
    assert await ws.receive_json(timeout=10) == {"type": "controls", "applied": {"yaw": 1.0}}
    assert await state(http, session) == "live"


def test_killing_a_replica_ends_only_its_sessions_and_serve_replaces_it(cluster: Cluster) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = await two_sessions(http, cluster.base)
            core = core_of(a["replica"]["pid"])
            folder = folder_of(core)
            async with http.ws_connect(a["urls"]["push"]) as ws_a, http.ws_connect(b["urls"]["push"]) as ws_b:
                await push_ready(ws_a)
                await push_ready(ws_b)
                rings = rings_of(core)
                assert rings, "the session's frame ring was not found"
                os.kill(a["replica"]["pid"], signal.SIGKILL)
                message = await ws_a.receive(timeout=15)
                assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR), (
                    message
                )
                await still_served(http, ws_b, b)
                await until(lambda: asyncio.sleep(0, not alive(core)), 10, "the killed replica's engine core exits")
                assert [ring for ring in rings if ring.exists()] == [], "the killed replica's rings were left behind"
                shutil.rmtree(folder)  # a process killed outright cannot remove its folder (Ray kills its whole group)
                await replaced(http, cluster.base, a["replica"]["id"])
                await still_served(http, ws_b, b)
            await delete_all(http, [b])

    run(scenario())


def test_a_replica_whose_core_stops_fails_its_health_check_ends_its_sessions_saying_why_and_is_replaced(
    cluster: Cluster,
) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = await two_sessions(http, cluster.base)
            core = core_of(a["replica"]["pid"])
            folder = folder_of(core)
            try:
                async with http.ws_connect(a["urls"]["push"]) as ws_a, http.ws_connect(b["urls"]["push"]) as ws_b:
                    await push_ready(ws_a)
                    await push_ready(ws_b)
                    rings = rings_of(core)
                    assert rings, "the session's frame ring was not found"
                    os.kill(core, signal.SIGSTOP)
                    message = await ws_a.receive(timeout=20)
                    assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 1011, message
                    assert "stopped ticking" in message.extra, message.extra
                    await still_served(http, ws_b, b)
                    await replaced(http, cluster.base, a["replica"]["id"])
                    await still_served(http, ws_b, b)
                assert not alive(core), "the stuck engine core was left behind"
                assert not folder.exists(), "the failed replica's service folder was left behind"
                assert [ring for ring in rings if ring.exists()] == [], "the failed replica's rings were left behind"
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(core, signal.SIGKILL)
            await delete_all(http, [b])

    run(scenario())


def test_a_replica_chosen_for_removal_stops_admitting_and_waits_for_its_sessions(cluster: Cluster) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            a, b = await two_sessions(http, cluster.base)
            scaling = asyncio.ensure_future(asyncio.to_thread(cluster.deploy, 1))

            async def draining() -> list[dict]:
                found = []
                for session in (a, b):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(f"{session['replica']['url']}/replica") as response:
                            if (await response.json())["capacity"]["draining"]:
                                found.append(session)
                return found

            await until(lambda: draining(), 30, "a replica starts draining")
            victim = (await draining())[0]
            survivor = b if victim is a else a
            await asyncio.sleep(3)
            assert await state(http, victim) == "live", "the drain cut a live session"
            status, late = await post(http, cluster.base)
            assert status == 201 and late["replica"]["id"] == survivor["replica"]["id"], late
            await scaling
            await delete_all(http, [victim])

            async def gone() -> bool:
                return await state(http, victim) is None

            await until(gone, 20, "the drained replica stops once its session ended")
            assert await state(http, survivor) == "live" and await state(http, late) == "live"
            await delete_all(http, [survivor, late])

    run(scenario())

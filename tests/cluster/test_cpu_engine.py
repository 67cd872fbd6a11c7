"""``python -m apps.serve --ray`` as a user runs it on the CPU: the real engine (random weights, 2 DDIM steps) in one
replica of a local Ray cluster started on loopback. A session opened through the proxy lives across the CPU's slow
ticks and records frames; every process the command started, Ray's own included, listens on loopback only but for
the one socket Ray Serve binds to every interface in each replica; the proxy reaches the replica's render jobs; one
Ctrl-C ends the session cleanly (push socket 1001, a playable MP4) and leaves no service folder, shared-memory ring or
file of the local Ray cluster behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

pytest.importorskip("ray")
av = pytest.importorskip("av")
from tests.cluster.listening import beyond_loopback, descendants, listening  # noqa: E402
from tests.serving.leftovers import service_files  # noqa: E402
from tests.serving.test_renders import wav_bytes  # noqa: E402
from tests.streaming.conftest import free_port  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
ALIVE_SECONDS = 10.0
"""How long the session must go on streaming after its first frame (several CPU ticks)."""
SERVE_REPLICA = b"ray::ServeReplica:"
"""How a Serve replica's process is titled: Ray Serve binds its inter-deployment gRPC server to ``[::]:0``
(ray/serve/_private/replica.py, ``_on_initialized``), an address no option moves."""


def portrait(path: Path) -> Path:
    """The demo portrait (scikit-image's astronaut) as a file the service registers at start."""
    from PIL import Image
    from skimage import data

    Image.fromarray(data.astronaut()).save(path)
    return path


def serve_replicas(pids: set[int]) -> set[int]:
    """The Serve replicas among ``pids``."""
    found = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(SERVE_REPLICA):
                found.add(pid)
        except OSError:
            continue
    return found


async def wait_ready(log: Path, process: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while "cluster: ready" not in log.read_text():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        await asyncio.sleep(0.5)


async def renders_through_the_proxy(http: aiohttp.ClientSession, base: str, session: dict, folder: Path) -> None:
    """The replica takes render jobs in a folder of its own and reports its queue, and the proxy sends a job to it
    (one the replica refuses for a bad option, before any engine work: its answer, passed through)."""
    replica = session["replica"]["id"]
    bad = {"avatar": "anchor", "overlap": "99"}
    async with http.post(f"{base}/renders", params=bad, data=wav_bytes(0.2)) as response:
        assert response.status == 400 and '"overlap" is an integer' in (await response.json())["error"]
    listed = await (await http.get(f"{base}/renders")).json()
    assert listed["renders"] == [] and listed["replicas"][replica]["limit"] == 4, listed
    reported = (await (await http.get(f"{base}/sessions")).json())["replicas"][replica]
    assert reported["renders"] == {"limit": 4, "queued": 0, "running": 0}, reported
    assert reported["url"] == session["replica"]["url"] and (folder / f"replica-{replica}").is_dir()


async def counters(http: aiohttp.ClientSession, session: dict) -> tuple[str, int]:
    async with http.get(session["urls"]["self"]) as response:
        body = await response.json()
    return body["state"], body["counters"].get("frames_released", 0)


def test_a_cpu_session_through_the_proxy_streams_on_loopback_and_one_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    port, log, mp4 = free_port(), tmp_path / "serve.log", tmp_path / "session.mp4"
    command = [
        sys.executable,
        "-m",
        "apps.serve",
        "--ray",
        "--device",
        "cpu",
        "--http",
        f"127.0.0.1:{port}",
        "--steps",
        "2",
        "--output-workers",
        "1",
        "--recordings",
        str(tmp_path),
        "--renders",
        str(tmp_path / "renders"),
        "--avatar",
        str(portrait(tmp_path / "astronaut.png")),
    ]
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": str(ROOT)}  # a local cluster
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            await wait_ready(log, process, 240)
            async with http.post(
                f"http://127.0.0.1:{port}/sessions", json={"avatar": "anchor", "mp4": mp4.name}
            ) as response:
                assert response.status == 201, await response.text()
                session = await response.json()
            async with http.ws_connect(session["urls"]["push"]) as ws:
                await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
                assert (await ws.receive_json(timeout=60))["type"] == "ready"
                tone = (0.2 * np.sin(np.arange(16000 * 3) * 2 * np.pi * 220 / 16000) * 32767).astype(np.int16)
                for start in range(0, len(tone), 3200):
                    await ws.send_bytes(tone[start : start + 3200].tobytes())
                    await asyncio.sleep(0.2)
                deadline = time.monotonic() + 240
                while (await counters(http, session))[1] == 0:
                    assert time.monotonic() < deadline, "no frame released in 240 s"
                    await asyncio.sleep(2)
                first = await counters(http, session)
                await asyncio.sleep(ALIVE_SECONDS)
                state, released = await counters(http, session)
                assert state == "live" and released > first[1], (first, state, released, log.read_text()[-2000:])
                await renders_through_the_proxy(http, f"http://127.0.0.1:{port}", session, tmp_path / "renders")

                pids = descendants(process.pid)
                ours = [
                    (host, p)
                    for _, host, p in listening(pids)
                    if p == port or session["replica"]["url"].endswith(f":{p}")
                ]
                assert sorted(ours) == sorted(
                    {("127.0.0.1", port), ("127.0.0.1", int(session["replica"]["url"].rsplit(":", 1)[1]))}
                )
                beyond = beyond_loopback(pids)
                replicas = serve_replicas(pids)
                assert len(replicas) == 2, "the engine's and the ingress's replicas were not found"
                assert sorted(pid for pid, _, _ in beyond) == sorted(replicas), beyond  # one socket each, no other
                assert {host for _, host, _ in beyond} == {"::"}, beyond
                assert "one socket per Serve replica listens beyond loopback" in log.read_text(), "and it says so"
                left = service_files(pids)
                assert left, "the service's folder and ring were not found"
                ray_files = Path(re.search(r"its files in (\S+) \(removed at the stop\)", log.read_text()).group(1))
                assert ray_files.is_dir() and any(Path(path).is_relative_to(ray_files) for path in left), left
                assert list(ray_files.glob("ditto-avatar-*")) == [], "the portrait's one-off cache outlived its load"

                stopped = time.monotonic()
                os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole process group
                message = await ws.receive(timeout=60)
                while message.type == aiohttp.WSMsgType.TEXT:  # events before the close (a CPU is behind real time)
                    message = await ws.receive(timeout=60)
                assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 1001, message
            assert await asyncio.to_thread(process.wait, 90) == 0, log.read_text()[-3000:]
            assert time.monotonic() - stopped < 10, "one Ctrl-C stops it all within 10 s"
            text = log.read_text()
            assert "Traceback" not in text and "terminate called" not in text, text[-3000:]
            assert "failed" not in text, text[-3000:]  # no task of Ray's failing at the stop either
            assert "stopping: ending the live sessions" in text, text[-3000:]
            assert [path for path in left if Path(path).exists()] == []
            assert not ray_files.exists(), "the local Ray cluster's files were left behind"
            assert [pid for pid in pids if Path(f"/proc/{pid}").exists() and pid != process.pid] == []
        with av.open(str(mp4)) as container:
            assert sum(1 for _ in container.decode(video=0)) >= released

    try:
        asyncio.run(scenario())
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

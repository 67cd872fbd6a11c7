"""The service as its processes run it: front end, engine core, output workers, over real sockets and shared memory.

The core runs a synthetic runtime (tests/streaming/synthetic_runtime.py: the runtime's contract,
frames on a live clock, no model), so what is under test is the service itself: the session API,
frames crossing processes, shedding, and what happens when a process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import av
import numpy as np
import pytest
from aiohttp import web

from serving.api import SessionError
from serving.http import app_runner, create_service_app
from serving.processes import ServiceOptions
from serving.renders import RenderLimits
from serving.service import Service
from serving.sessions import SessionSpec
from tests.streaming.conftest import free_port

pytestmark = pytest.mark.slow
RUNTIME = "tests.streaming.synthetic_runtime:build"


@contextlib.asynccontextmanager
async def running(
    workers: int = 2, admission: bool = True, recordings: Path | None = None, renders: RenderLimits | None = None
) -> AsyncIterator[tuple[Service, aiohttp.ClientSession, str]]:
    """A started service with its HTTP API on a free port, and a client; everything stopped on the way out.
    ``recordings``: the folder sessions record their MP4 names into (None: the server records no files); ``renders``:
    what its render jobs may take (None: it takes none)."""
    options = ServiceOptions(
        workers=workers,
        admission=admission,
        runtime=RUNTIME,
        recordings=recordings and str(recordings),
        renders=renders,
    )
    service = Service(options)
    await service.start()
    runner = app_runner(create_service_app(service))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as http:
            yield service, http, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await service.close()


async def released(http: aiohttp.ClientSession, base: str, session_id: str) -> int:
    body = await (await http.get(f"{base}/sessions/{session_id}")).json()
    return body["counters"].get("frames_released", 0)


async def until(condition, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.1)):
        if await condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_sessions_of_two_avatars_come_and_go_through_the_api(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "serving.service")

    async def scenario() -> None:
        async with running(recordings=tmp_path) as (service, http, base):
            timeline = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("service ready"))
            assert (
                "engine core spawned" in timeline
                and "imported" in timeline
                and timeline.endswith("s")
                and "2 output worker(s) ready" in timeline
            )
            assert (await (await http.get(f"{base}/sessions")).json())["sessions"] == []
            made = []
            for avatar in ("anna", "ben"):
                response = await http.post(f"{base}/sessions", json={"avatar": avatar, "mp4": f"{avatar}.mp4"})
                assert response.status == 201, await response.text()
                made.append(await response.json())
            anna, ben = (m["id"] for m in made)
            assert made[1]["size"] == [96, 64] and made[1]["urls"]["push"].endswith(f"/push?session={ben}")
            listing = await (await http.get(f"{base}/sessions")).json()
            assert {s["id"] for s in listing["sessions"]} == {anna, ben} and listing["capacity"]["admitted"] == 4

            async with http.ws_connect(f"{base}/push?session={anna}") as ws:
                await ws.send_json({"type": "format", "sample_rate": 24000, "channels": 1, "encoding": "s16le"})
                assert (await ws.receive_json(timeout=5))["type"] == "ready"
                await ws.send_bytes(b"\x00\x01" * 24000)
                await ws.send_json({"type": "controls", "yaw": 5})
                assert await ws.receive_json(timeout=5) == {"type": "controls", "applied": {"yaw": 5.0}}
            body = await (await http.get(f"{base}/sessions/{anna}")).json()
            assert body["counters"]["pushed_seconds"] == 1.0, "the audio reached anna's session on the core"

            await until(lambda: _more(http, base, ben, 10))
            response = await http.delete(f"{base}/sessions/{anna}")
            assert response.status == 200 and (await response.json())["state"] == "ended"
            before = await released(http, base, ben)
            await asyncio.sleep(1.0)
            assert await released(http, base, ben) >= before + 20, "ben goes on at 25 fps after anna ended"
            assert (await http.get(f"{base}/sessions/{anna}")).status == 404
            assert (await http.delete(f"{base}/sessions/{ben}")).status == 200
        for avatar, size in (("anna", (64, 64)), ("ben", (96, 64))):
            with av.open(str(tmp_path / f"{avatar}.mp4")) as container:
                video = container.streams.video[0]
                assert (video.width, video.height) == size and sum(1 for _ in container.decode(video=0)) > 10

    asyncio.run(scenario())


async def _more(http: aiohttp.ClientSession, base: str, session_id: str, count: int) -> bool:
    return await released(http, base, session_id) >= count


def connections_made(count: list[int]) -> aiohttp.TraceConfig:
    """A client trace that counts the connections the client opens (a request on a pooled one opens none)."""

    async def made(*_) -> None:
        count[0] += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(made)
    return trace


def test_create_and_delete_cycles_on_one_keep_alive_connection_while_sessions_push() -> None:
    """Issue 54: under live streams the first POST after DELETEs met a dropped connection. The server closed idle
    connections after 10 s, which aiohttp's client keeps pooled for 15 s: one reused as the server closed it dropped the
    request (the client retries a GET or DELETE on a fresh connection, never a POST). Now every request goes over the
    one connection the client opened, also after an idle of 12 s (past the old 10 s, within the client's 15)."""

    async def scenario() -> None:
        async with running(workers=2, admission=False) as (service, http, base):
            live = [
                (await (await http.post(f"{base}/sessions", json={"avatar": "anna"})).json())["id"] for _ in range(3)
            ]
            stop = asyncio.Event()
            pushers = [asyncio.ensure_future(push_until(f"ws://{base[7:]}/push?session={i}", stop)) for i in live]
            idle_opened, cycles_opened = [0], [0]
            try:
                async with (
                    one_connection(idle_opened) as idle,
                    one_connection(cycles_opened) as cycling,
                ):
                    assert (await idle.get(f"{base}/sessions")).status == 200
                    idle_since = time.monotonic()
                    before = [await released(http, base, i) for i in live]
                    cycles = await create_and_delete(cycling, base, seconds=10.5)  # a cycle takes under a second
                    await asyncio.sleep(max(0.0, idle_since + 12.0 - time.monotonic()))
                    response = await idle.post(f"{base}/sessions", json={"avatar": "ben"})
                    assert response.status == 201, "answered after an idle the client's pool allows"
                after = [await released(http, base, i) for i in live]
                assert (idle_opened[0], cycles_opened[0]) == (1, 1), (
                    f"one connection each: {idle_opened[0]}, {cycles_opened[0]} opened ({cycles} cycles)"
                )
                assert all(a - b >= 25 * 10 for a, b in zip(after, before)), (before, after)
                stop.set()
                assert await asyncio.gather(*pushers) == [[]] * 3, "no pusher was told of an error"
            finally:
                stop.set()
                for pusher in pushers:
                    pusher.cancel()

    asyncio.run(scenario())


def one_connection(opened: list[int]) -> aiohttp.ClientSession:
    """A client of one pooled connection at most, counting in ``opened`` the connections it opens (a request on the
    pooled one opens none)."""

    async def made(*_) -> None:
        opened[0] += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(made)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), trace_configs=[trace])


async def create_and_delete(http: aiohttp.ClientSession, base: str, seconds: float) -> int:
    """Two sessions created, then deleted, again and again for ``seconds``; the cycles made."""
    cycles, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        made = []
        for _ in range(2):
            response = await http.post(f"{base}/sessions", json={"avatar": "anna"})
            assert response.status == 201, await response.text()
            made.append((await response.json())["id"])
        await asyncio.sleep(0.2)
        for session_id in made:
            response = await http.delete(f"{base}/sessions/{session_id}")
            assert response.status == 200 and (await response.json())["state"] == "ended"
        cycles += 1
    return cycles


async def push_until(url: str, stop: asyncio.Event) -> list[str]:
    """Push the synthetic sound in real time into ``url`` until ``stop``; the errors the server answered."""
    from harness.push import Pusher
    from tests.streaming.synthetic import sound

    second = np.concatenate([sound(i) for i in range(25)])  # 1 s at the output's 48 kHz
    async with Pusher(url, 48000, 9600) as pusher:
        while not stop.is_set():
            await pusher.play(second)
        return pusher.errors


def test_bad_requests_get_clear_answers_and_capacity_is_a_503() -> None:
    async def scenario() -> None:
        async with running() as (service, http, base):
            for body, status, text in [
                ({"avatar": "nobody"}, 404, "avatars available: anchor1080, anna, ben, crawl, echo, late, slow"),
                ({}, 400, '"avatar"'),
                ({"avatar": "anna", "rtmp": "http://x"}, 400, "rtmp://"),
                ({"avatar": "anna", "colour": "red"}, 400, "unknown field"),
                ({"avatar": "anna", "overlap": 80}, 400, "overlap"),
                ({"avatar": "anna", "latency": "fast"}, 400, "faithful, low"),
            ]:
                response = await http.post(f"{base}/sessions", json=body)
                assert response.status == status and text in (await response.json())["error"], body
            assert (await http.get(f"{base}/sessions/nope")).status == 404
            low = await (await http.post(f"{base}/sessions", json={"avatar": "anna", "latency": "low"})).json()
            shown = await (await http.get(f"{base}/sessions/{low['id']}")).json()
            assert (shown["latency"], shown["overlap"]) == ("low", 77), (
                "the low-latency mode's own overlap unless given one"
            )
            async with http.ws_connect(f"{base}/push?session={low['id']}") as ws:
                await ws.send_json({"type": "format", "sample_rate": 16000})
                assert (await ws.receive_json(timeout=5))["latency"] == "low", "the pusher is told the session's mode"
            for _ in range(3):
                assert (await http.post(f"{base}/sessions", json={"avatar": "anna"})).status == 201
            response = await http.post(f"{base}/sessions", json={"avatar": "anna"})
            assert response.status == 503 and "at most 4" in await response.text()

    asyncio.run(scenario())


def test_hostile_session_requests_get_a_400_naming_the_field_and_record_only_new_files_inside_the_folder(
    tmp_path: Path,
) -> None:
    (tmp_path / "taken.mp4").write_bytes(b"someone's file")
    deep = "[" * 100_000 + "]" * 100_000

    async def scenario() -> None:
        async with running(workers=1, recordings=tmp_path) as (service, http, base):
            for body, text in [
                ({"avatar": "anna", "mp4": "../out.mp4"}, '"mp4"'),
                ({"avatar": "anna", "mp4": "/tmp/out.mp4"}, '"mp4"'),
                ({"avatar": "anna", "mp4": "taken.mp4"}, "never replaces"),
                ({"avatar": "anna", "rtmp": ["rtmp://h/a/k"] * 9}, '"rtmp": at most 8'),
                ({"avatar": "anna", "rtmp": "rtmp://h/a/k\nforged log line"}, '"rtmp"'),
                ({"avatar": "anna", "controls": {"self": 1}}, '"controls"'),
                ({"avatar": "anna", "controls": {"yaw": "x"}}, '"controls"'),
                ({"avatar": "anna", "latency": []}, '"latency"'),
                ({"avatar": "anna", "latency": {}}, '"latency"'),
                ({"avatar": "anna", "overlap": 1e23}, '"overlap"'),
                ({"avatar": "anna", "end_on_disconnect": "yes"}, '"end_on_disconnect"'),
                ([{"avatar": "anna"}], "JSON object"),
            ]:
                response = await http.post(f"{base}/sessions", json=body)
                assert response.status == 400 and text in (await response.json())["error"], (
                    body,
                    await response.text(),
                )
            response = await http.post(f"{base}/sessions", data=deep, headers={"Content-Type": "application/json"})
            assert response.status == 400 and "nested" in await response.text()
            assert (tmp_path / "taken.mp4").read_bytes() == b"someone's file"

            made = await (await http.post(f"{base}/sessions", json={"avatar": "anna", "mp4": "day/one.mp4"})).json()
            assert made["outputs"]["mp4"] == "day/one.mp4", "the client's name is shown, never the server's path"
            with pytest.raises(SessionError, match="unknown control"):
                await service.sessions[made["id"]].audio.update_controls(**{"self": 1})
            with pytest.raises(SessionError, match="fade_in"):
                await service.sessions[made["id"]].audio.update_controls(fade_in=2**70)
            assert not service.core._waiting, "no request is left waiting for a reply that never comes"
            await until(lambda: _more(http, base, made["id"], 5))
            assert (await http.delete(f"{base}/sessions/{made['id']}")).status == 200
        assert (tmp_path / "day" / "one.mp4").stat().st_size > 0

    asyncio.run(scenario())


def test_a_server_without_a_recordings_folder_records_no_files() -> None:
    with pytest.raises(SessionError, match='"mp4": this server records no files; start it with --recordings DIR'):
        SessionSpec.from_json({"avatar": "anna", "mp4": "out.mp4"})


def test_malformed_messages_on_the_internal_sockets_are_dropped_and_every_process_goes_on() -> None:
    import zmq

    from serving.protocol import Hello, encode

    async def scenario() -> None:
        async with running(workers=1) as (service, http, base):
            session_id = (await (await http.post(f"{base}/sessions", json={"avatar": "anna"})).json())["id"]
            context = zmq.Context()
            try:
                core = context.socket(zmq.DEALER)
                core.connect(service.core._socket.getsockopt_string(zmq.LAST_ENDPOINT))
                core.send(b"one frame, no number")
                core.send_multipart([b"\x00" * 8, b"not msgpack"])
                assert core.poll(5000), "the core answers an undecodable request"
                worker = context.socket(zmq.PUSH)
                worker.connect(service.processes.workers[0].address)
                for junk in (b"not msgpack", b"\x92\xa3Bad\x80", encode(Hello())):
                    worker.send(junk)
                await asyncio.sleep(1.0)
                core.close(0)
                worker.close(0)
            finally:
                context.term()
            processes = service.processes
            assert processes.core_process.poll() is None and processes.workers[0].process.poll() is None, "nobody died"
            before = await released(http, base, session_id)
            await until(lambda: _more(http, base, session_id, before + 10))
            assert (await http.post(f"{base}/sessions", json={"avatar": "ben"})).status == 201

    asyncio.run(scenario())


SMALL_DISK = 64 * 1024
"""Bytes of the file system a recording fills in the output faults' test."""


def small_file_system(folder: Path) -> list[str] | None:
    """A command prefix that runs a command with ``folder`` a tmpfs of SMALL_DISK bytes, in a mount namespace of its
    own (``unshare``: nothing outside sees it); None where this machine lets no process make one."""
    mount = f"mount -t tmpfs -o size={SMALL_DISK} tmpfs"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f'{mount} "$0"', str(folder)], capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "-rm", "sh", "-c", f'{mount} "$0" && exec "$@"', str(folder)]


def test_an_rtmp_server_that_goes_and_comes_back_and_a_full_disk_are_told_in_the_session_state(
    nginx_rtmp, tmp_path: Path
) -> None:
    """Issue 54: the service's real command line (``harness.synthetic_serve``) recording into a file system that fills
    (a real ENOSPC) and streaming to an nginx-rtmp that stops and starts again: the recording is detached and the
    session says why and tells its pusher, the RTMP output says it is reconnecting, then that it is back; the session
    stays live throughout."""
    from tests.integrations.synthetic_service import REPO, start, stop

    recordings = tmp_path / "recordings"
    recordings.mkdir()
    prefix = small_file_system(recordings)
    if prefix is None:
        pytest.skip("this machine lets no process mount a small tmpfs in a namespace of its own (unshare -rm)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "harness.synthetic_serve", "--avatar", "anchor", "--sessions", "0"]
    serve += ["--http", f"127.0.0.1:{port}", "--recordings", str(recordings), "--output-workers", "1"]
    server = start([*prefix, *serve], base, {**os.environ, "PYTHONPATH": str(REPO)}, 60, {})

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            body = {"avatar": "anchor", "rtmp": nginx_rtmp.url("faults"), "mp4": "full.mp4"}
            session_id = (await (await http.post(f"{base}/sessions", json=body)).json())["id"]

            async def shown() -> dict:
                return await (await http.get(f"{base}/sessions/{session_id}")).json()

            async def rtmp(state: str) -> bool:
                return (await shown())["sinks"].get("rtmp", {}).get("state") == state

            async with http.ws_connect(f"{base}/push?session={session_id}") as ws:
                told = await ws.receive_json(timeout=30)
                assert told["type"] == "output_failed" and told["sink"] == "mp4", told
                assert "No space left on device" in told["message"], told
            now = await shown()
            assert now["state"] == "live" and now["error"] == f"mp4: {told['message']}", now

            async def detached() -> bool:
                return "mp4" not in (await shown())["sinks"]

            await until(detached, seconds=5)
            await until(lambda: rtmp("connected"), seconds=10)
            nginx_rtmp.stop()
            await until(lambda: rtmp("reconnecting"), seconds=10)
            away = (await shown())["sinks"]["rtmp"]
            assert away["error"] and away["retry_in_s"] is not None and away["connected"] == 0, away
            nginx_rtmp.start()
            await until(lambda: rtmp("connected"), seconds=20)
            back = await shown()
            assert back["sinks"]["rtmp"]["reconnects"] == 1 and back["sinks"]["rtmp"]["error"] is None, back
            assert back["state"] == "live"
            assert (await http.delete(f"{base}/sessions/{session_id}")).status == 200

    try:
        asyncio.run(scenario())
    finally:
        stop(server)
    assert server.returncode == 0, server.stderr.read()[-3000:]


def test_an_overloaded_session_sheds_frames_and_its_stream_keeps_wall_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the pushers are told past it (5 s takes 10 s here)
    monkeypatch.setattr("serving.session_events.BEHIND_SECONDS", 1.0)

    async def scenario() -> None:
        async with running(workers=1) as (service, http, base):
            session = await (await http.post(f"{base}/sessions", json={"avatar": "slow"})).json()
            async with http.ws_connect(f"{base}/push?session={session['id']}") as ws:
                await until(lambda: _more(http, base, session["id"], 1))
                start = await released(http, base, session["id"])
                await asyncio.sleep(2.0)
                body = await (await http.get(f"{base}/sessions/{session['id']}")).json()
                assert body["counters"]["frames_released"] - start >= 45, "the output clock holds 25 fps"
                assert body["counters"]["repeated"] >= 15, "half the slots have no frame: shed and counted"
                assert body["degraded"], "and the session is reported as shedding"
                assert body["behind_seconds"] >= 0.5, "its renders fall behind its live clock, and GET says how far"

                async def further_behind() -> bool:  # as its slow ticks end (later on a busy machine)
                    later = await (await http.get(f"{base}/sessions/{session['id']}")).json()
                    return later["behind_seconds"] >= body["behind_seconds"] + 0.3

                await until(further_behind, seconds=5.0)
                told = await ws.receive_json(timeout=5)
                assert told["type"] == "behind_real_time" and told["seconds"] > 1.0, told
        assert "more sessions than the CPU serves" in caplog.text, "the log names the device, not a GPU"
        assert "behind real time: the CPU renders slower than real time" in caplog.text

    asyncio.run(scenario())


def test_behind_seconds_is_null_until_the_first_frame() -> None:
    """Before its first frame (the first window on a CPU) a session is unmeasured: null, never a 0 that keeps up."""

    async def scenario() -> None:
        async with running(workers=1) as (_, http, base):
            session_id = (await (await http.post(f"{base}/sessions", json={"avatar": "late"})).json())["id"]
            await asyncio.sleep(1.5)  # the worker has reported its counters: still no frame
            body = await (await http.get(f"{base}/sessions/{session_id}")).json()
            assert "behind_seconds" in body["counters"] and body["behind_seconds"] is None, body
            await until(lambda: _more(http, base, session_id, 1))
            await asyncio.sleep(1.1)
            body = await (await http.get(f"{base}/sessions/{session_id}")).json()
            assert 0.0 <= body["behind_seconds"] < 1.0, body

    asyncio.run(scenario())


def test_a_dead_output_worker_fails_only_its_sessions_and_is_replaced() -> None:
    async def scenario() -> None:
        async with running(workers=2) as (service, http, base):
            first = (await (await http.post(f"{base}/sessions", json={"avatar": "anna"})).json())["id"]
            second = (await (await http.post(f"{base}/sessions", json={"avatar": "anna"})).json())["id"]
            assert service.sessions[first].worker != service.sessions[second].worker
            await until(lambda: _more(http, base, second, 5))
            async with http.ws_connect(f"{base}/push?session={first}") as ws:
                await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
                assert (await ws.receive_json(timeout=5))["type"] == "ready"
                await ws.send_bytes(b"\x00\x10" * 16000 * 5)  # 5 s, cut by the worker's death
                await ws.send_json({"type": "end_of_segment"})
                assert (await ws.receive_json(timeout=5)) == {"type": "end_of_segment", "segment": 0}
                assert (await ws.receive_json(timeout=5)) == {"type": "playback_started", "segment": 0}
                dead = service.processes.workers[service.sessions[first].worker]
                os.kill(dead.process.pid, signal.SIGKILL)
                finished = await ws.receive_json(timeout=5)
                assert finished["type"] == "playback_finished" and finished["segment"] == 0 and finished["interrupted"]
                failed = await ws.receive_json(timeout=5)
                assert failed["type"] == "session_failed" and "output worker" in failed["message"]
                closing = await ws.receive(timeout=5)
                assert (
                    closing.type == aiohttp.WSMsgType.CLOSE
                    and closing.data == 1011
                    and "output worker" in closing.extra
                )
            await until(lambda: _state(http, base, first, "failed"))
            body = await (await http.get(f"{base}/sessions/{first}")).json()
            assert "output worker" in body["error"]
            before = await released(http, base, second)
            await asyncio.sleep(1.0)
            assert await released(http, base, second) >= before + 20, "the other worker's stream goes on"
            replacement = service.processes.workers[dead.index]
            await asyncio.wait_for(replacement.ready.wait(), 30)
            assert replacement.process.pid != dead.process.pid and replacement.alive
            third = await http.post(f"{base}/sessions", json={"avatar": "ben"})
            assert third.status == 201, "the dead worker was replaced for new sessions"
            third_id = (await third.json())["id"]
            assert service.sessions[third_id].worker == dead.index, "the new session went to the replacement"
            await until(lambda: _more(http, base, third_id, 10))

    asyncio.run(scenario())


async def _state(http: aiohttp.ClientSession, base: str, session_id: str, state: str) -> bool:
    return (await (await http.get(f"{base}/sessions/{session_id}")).json())["state"] == state


def test_a_dead_core_fails_every_session_saying_why_answers_503_at_once_and_is_started_again() -> None:
    async def scenario() -> None:
        async with running(workers=1) as (service, http, base):
            ids = [
                (await (await http.post(f"{base}/sessions", json={"avatar": "anna"})).json())["id"] for _ in range(2)
            ]
            async with http.ws_connect(f"{base}/push?session={ids[0]}") as ws:
                await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
                assert (await ws.receive_json(timeout=5))["type"] == "ready"
                dead = service.processes.core_process.pid
                os.kill(dead, signal.SIGKILL)
                killed = time.monotonic()
                response = await http.post(f"{base}/sessions", json={"avatar": "anna"})
                refused = (await response.json())["error"]
                assert time.monotonic() - killed < 1.0, "answered within a second, not left waiting"
                assert response.status == 503 and "engine core exited with code -9" in refused, refused
                assert "started again" in refused, refused
                failed = await ws.receive_json(timeout=5)
                assert failed["type"] == "session_failed" and "engine core exited" in failed["message"], failed
                assert (await ws.receive(timeout=5)).data == 1011
            for session_id in ids:
                body = await (await http.get(f"{base}/sessions/{session_id}")).json()
                assert body["state"] == "failed" and "engine core exited with code -9" in body["error"], body

            async def created() -> bool:
                response = await http.post(f"{base}/sessions", json={"avatar": "anna"})
                return response.status == 201 and bool(ids.append((await response.json())["id"]) or True)

            await until(created, seconds=60)
            assert service.processes.core_process.pid != dead and service.failure is None
            await until(lambda: _more(http, base, ids[-1], 10))

            processes = service.processes
            processes.options = dataclasses.replace(processes.options, core_restarts=1)  # one restart in the window
            os.kill(service.processes.core_process.pid, signal.SIGKILL)
            await asyncio.wait_for(service.failed.wait(), 5)
            response = await http.post(f"{base}/sessions", json={"avatar": "anna"})
            refused = (await response.json())["error"]
            assert response.status == 503 and "the service has failed" in refused and "died 2 times" in refused

    asyncio.run(scenario())


def test_one_long_push_waits_for_room_without_holding_up_any_other_session() -> None:
    """Issue 28: one WebSocket message of more than twice a session's lead used to park an executor thread forever."""

    async def scenario() -> None:
        async with running(workers=1) as (service, http, base):
            long_id, other_id = [
                (await (await http.post(f"{base}/sessions", json={"avatar": "anna"})).json())["id"] for _ in range(2)
            ]
            fmt = {"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"}
            async with (
                http.ws_connect(f"{base}/push?session={long_id}") as long_ws,
                http.ws_connect(f"{base}/push?session={other_id}") as ws,
            ):
                for socket in (long_ws, ws):
                    await socket.send_json(fmt)
                    assert (await socket.receive_json(timeout=5))["type"] == "ready"
                await long_ws.send_bytes(b"\x00\x01" * 16000 * 8)  # 8 s in one message: 3 s beyond the lead
                await long_ws.send_json({"type": "controls", "yaw": 1})
                for i in range(6):
                    await ws.send_bytes(b"\x00\x01" * 1600)
                    await ws.send_json({"type": "controls", "yaw": i})
                    assert (await ws.receive_json(timeout=1))["type"] == "controls", (
                        "the other session is answered at once"
                    )
                reply = await long_ws.receive_json(timeout=10)
                while reply["type"].startswith("playback_"):  # its speech is being shown meanwhile
                    reply = await long_ws.receive_json(timeout=10)
                assert reply == {"type": "controls", "applied": {"yaw": 1.0}}, (
                    "the long push went in once there was room"
                )
            body = await (await http.get(f"{base}/sessions/{long_id}")).json()
            assert body["counters"]["pushed_seconds"] == 8.0

    asyncio.run(scenario())


def test_sessions_created_and_deleted_leave_the_workers_memory_flat(tmp_path: Path) -> None:
    """A worker that keeps every closed MP4/FLV muxer until a full garbage collection grows with each session
    (the create/delete cycles of bench/results/2026-12-01_h200_service_12_16_streams_after_phase_fix.json). Measured
    from session 30: before it a worker's resident size can still step up once by a few MB, and it flattens after."""
    from serving.core import resident_mb

    async def scenario() -> list[float]:
        async with running(workers=1) as (service, http, base):
            pid = service.processes.workers[0].process.pid
            sizes = []
            for i in range(51):
                if i in (30, 50):  # after the first sessions' allocations have settled
                    sizes.append(resident_mb(pid))
                session = await service.create(
                    SessionSpec("anna", mp4=f"{i}.mp4", recording=str(tmp_path / f"{i}.mp4"))
                )
                deadline = time.monotonic() + 30
                while not session.output_stats.get("frames_released"):
                    assert time.monotonic() < deadline, (
                        f"session {i} released no frame within 30 s: {session.output_stats}"
                    )
                    await asyncio.sleep(0.02)
                await service.delete(session.id)
                service.forget(session.id)
            return sizes

    before, after = asyncio.run(scenario())
    assert after - before < 4.0, f"worker resident {before:.1f} -> {after:.1f} MB over 20 sessions"


def test_the_push_websocket_tells_when_each_segment_is_shown_and_when_it_ends_or_is_cut() -> None:
    async def scenario() -> None:
        async with running(workers=1) as (service, http, base):
            session_id = (await (await http.post(f"{base}/sessions", json={"avatar": "anna"})).json())["id"]
            async with http.ws_connect(f"{base}/push?session={session_id}") as ws:
                backlog: list[dict] = []

                async def next_of(kind: str) -> dict:
                    """The next message of ``kind``; those of other kinds wait in order for their own call."""
                    while not any(m["type"] == kind for m in backlog):
                        backlog.append(await ws.receive_json(timeout=10))
                    return backlog.pop(next(i for i, m in enumerate(backlog) if m["type"] == kind))

                await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
                await next_of("ready")
                await ws.send_bytes(b"\x00\x10" * 6400)  # 0.4 s
                await ws.send_json({"type": "end_of_segment"})
                assert await next_of("end_of_segment") == {"type": "end_of_segment", "segment": 0}
                assert await next_of("playback_started") == {"type": "playback_started", "segment": 0}
                assert await next_of("playback_finished") == {
                    "type": "playback_finished",
                    "segment": 0,
                    "position": 0.4,
                    "interrupted": False,
                }

                await ws.send_bytes(b"\x00\x10" * 32000)  # 2 s, cut after it starts
                assert await next_of("playback_started") == {"type": "playback_started", "segment": 1}
                await ws.send_json({"type": "interrupt"})
                assert await next_of("interrupted") == {"type": "interrupted", "segment": 1}
                await ws.send_json({"type": "interrupt"})
                assert await next_of("interrupted") == {"type": "interrupted", "segment": None}, (
                    "nothing open: no segment"
                )
                finished = await next_of("playback_finished")
                assert finished["segment"] == 1 and finished["interrupted"] and 0 < finished["position"] < 2.0, finished
                await ws.send_bytes(b"\x00\x10" * 1600)
                await ws.send_json({"type": "end_of_segment"})
                assert (await next_of("playback_finished"))["segment"] == 2, "exactly one finish each, in order"

    asyncio.run(scenario())

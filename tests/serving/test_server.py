"""The server: one name per session, its wiring over the runtime contract, and how it stops."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import time
import types
import wave
from pathlib import Path

import aiohttp
import av
import numpy as np
import pytest

import serving.server as server_module
from apps.serve import parse_args, server_options
from serving.server import ServerOptions, numbered
from serving.sessions import SessionSpec
from tests.serving.test_service import RUNTIME
from tests.streaming.conftest import free_port
from tests.streaming.media import LiveReader


def synthetic(argv: list[str], runtime: str = RUNTIME) -> ServerOptions:
    """The server options of a command line, the core running the synthetic ``runtime`` in place of the engine's."""
    options = server_options(parse_args(argv))
    return dataclasses.replace(options, service=dataclasses.replace(options.service, runtime=runtime))


def test_each_session_gets_its_own_url_and_file() -> None:
    assert numbered("rtmp://h/live/key", 0, 3) == "rtmp://h/live/key"
    assert numbered("rtmp://h/live/key", 2, 3) == "rtmp://h/live/key-2"
    assert numbered("out/rec.mp4", 1, 2) == "out/rec-1.mp4"
    assert numbered("out/rec.mp4", 1, 1) == "out/rec.mp4"


@pytest.mark.slow
def test_serve_opens_its_sessions_through_the_service_and_ends_with_them(nginx_rtmp) -> None:
    """Everything but the model (the core runs the synthetic runtime): two sessions, RTMP and push per session,
    controls from the flags; ending both ends the server."""
    port = free_port()
    options = synthetic(
        [
            "--avatar",
            "anna.png",
            "--sessions",
            "2",
            "--listen",
            "--device",
            "cpu",
            "--no-admission",
        ]
        + [
            "--rtmp",
            nginx_rtmp.url("show"),
            "--http",
            f"127.0.0.1:{port}",
            "--yaw",
            "-4",
            "--emotion",
            "happy",
            "--output-workers",
            "1",
        ]
    )
    readers = []

    async def drive() -> dict:
        server = asyncio.ensure_future(server_module.serve(options))
        async with aiohttp.ClientSession() as http:

            async def metrics() -> str:
                with contextlib.suppress(aiohttp.ClientError):
                    response = await http.get(f"http://127.0.0.1:{port}/metrics")
                    if response.status == 200:
                        return await response.text()
                return ""

            for _ in range(400):
                if 'ditto_rtmp_connected{session="1"} 1.0' in await metrics():
                    break
                await asyncio.sleep(0.05)
            readers.append(LiveReader(nginx_rtmp.url("show-1"), read_timeout=2.0))
            await asyncio.sleep(3.0)  # more than one 2 s GOP: the reader starts at the next IDR
            text = await metrics()
            listing = await (await http.get(f"http://127.0.0.1:{port}/sessions")).json()
            for name in ("0", "1"):
                async with http.ws_connect(f"ws://127.0.0.1:{port}/push?session={name}") as ws:
                    await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
                    assert (await ws.receive_json(timeout=5))["type"] == "ready"
                    await ws.send_bytes(b"\x00\x01" * 1600)
                    await ws.send_json({"type": "end"})
                    assert await ws.receive_json(timeout=5) == {"type": "ended"}
        assert await asyncio.wait_for(server, 30) == 0
        return {"metrics": text, "listing": listing}

    result = asyncio.run(drive())
    assert "ditto_sessions 2.0" in result["metrics"]
    assert 'ditto_frames_sent_total{session="1",sink="rtmp"}' in result["metrics"]
    assert 'ditto_capacity{kind="runtime"} 4.0' in result["metrics"]
    sessions = result["listing"]["sessions"]
    assert [s["id"] for s in sessions] == ["0", "1"] and sessions[1]["outputs"]["rtmp"] == [
        nginx_rtmp.url("show-1").rsplit("/", 1)[0] + "/***"
    ]
    got = readers[0].join()
    assert got.size == (128, 128) and len(got.indices) >= 20, got.error
    assert got.indices == list(range(got.indices[0], got.indices[0] + len(got.indices)))


def test_a_spoken_file_reaches_rtmp_and_mp4_with_its_audio(tmp_path, nginx_rtmp) -> None:
    """``--audio``: the file is pushed into one session whose frames go to RTMP and an MP4, and the server ends once
    it is spoken. The core's ``echo`` session speaks the pushed audio itself, so the MP4's sound is the file's."""
    rate, seconds = 24_000, 1.0
    t = np.arange(int(seconds * rate)) / rate
    with wave.open(str(tmp_path / "speech.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((0.4 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16).tobytes())
    mp4 = tmp_path / "live.mp4"
    argv = ["--avatar", "echo", "--audio", str(tmp_path / "speech.wav"), "--mp4", str(mp4)]
    argv += ["--rtmp", nginx_rtmp.url("file"), "--device", "cpu", "--output-workers", "1"]
    options = synthetic(argv + ["--http", f"127.0.0.1:{free_port()}"])
    assert asyncio.run(asyncio.wait_for(server_module.serve(options), 120)) == 0
    with av.open(str(mp4)) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert (video.width, video.height) == (128, 128) and audio.rate == 48_000
        frames = sum(1 for _ in container.decode(video=0))
        container.seek(0)
        sound = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert frames >= seconds * 25, "every frame of the spoken file"
    loud = (np.abs(sound) > 0.2).sum() / 2 / 48_000  # stereo; a 0.4 sine is above 0.2 two thirds of the time
    assert 0.9 < loud / (2 / 3 * seconds) < 1.1, "the file's tone, once, in the MP4"


@pytest.mark.parametrize(
    "runtime, while_", [(RUNTIME + "_slowly", "warming up"), (RUNTIME[: -len("build")] + "build_busy", "serving")]
)
def test_ctrl_c_stops_the_server_within_seconds(runtime: str, while_: str, capfd: pytest.CaptureFixture) -> None:
    """Issue 28: Ctrl-C was ignored for 40 s or more during start-up and took 60-110 s after it. A core whose loop is
    inside a tick ends without aborting (issue 45: "terminate called without an active exception")."""
    argv = ["--avatar", "anna.png", "--sessions", "2", "--device", "cpu", "--output-workers", "1"]
    options = synthetic(argv + ["--http", f"127.0.0.1:{free_port()}"], runtime)

    async def interrupted() -> tuple[int, float]:
        server = asyncio.ensure_future(server_module.serve(options))
        await asyncio.sleep(8.0 if while_ == "serving" else 3.0)
        assert not server.done(), server
        os.kill(os.getpid(), signal.SIGINT)
        started = time.monotonic()
        code = await asyncio.wait_for(server, 30)
        return code, time.monotonic() - started

    code, seconds = asyncio.run(interrupted())
    assert code == (130 if while_ == "warming up" else 0) and seconds < 8, (while_, code, seconds)
    assert "terminate called" not in capfd.readouterr().err


@pytest.mark.slow
def test_one_ctrl_c_with_sessions_pushing_and_recording_stops_everything_and_leaves_nothing(tmp_path) -> None:
    """Issue 54: a pushing client held the stop for aiohttp's 60 s wait on open requests. One Ctrl-C now ends the
    sessions (their MP4s finished, the pushers told why), then closes the connections and stops every process within
    seconds, leaving no process, service folder or shared-memory ring."""
    from tests.cluster.listening import descendants
    from tests.serving.leftovers import service_files

    argv = ["--avatar", "anna.png", "--sessions", "2", "--listen", "--device", "cpu", "--output-workers", "1"]
    port = free_port()
    argv += ["--mp4", "start.mp4", "--recordings", str(tmp_path), "--http", f"127.0.0.1:{port}"]
    options = synthetic(argv)

    async def interrupted() -> tuple[int, float, set[int], set[str], list]:
        ours = descendants(os.getpid())  # this process and its helpers (multiprocessing's tracker), not the service's
        server = asyncio.ensure_future(server_module.serve(options))
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            for _ in range(200):  # until the sessions at start are open
                with contextlib.suppress(aiohttp.ClientError):
                    if len((await (await http.get(f"{base}/sessions")).json())["sessions"]) == 2:
                        break
                await asyncio.sleep(0.1)
            made = await http.post(f"{base}/sessions", json={"avatar": "ben", "mp4": "client.mp4"})
            assert made.status == 201, await made.text()
            closes = []

            async def pushing(name: str) -> None:
                """Push 0.2 s every 0.2 s until the server closes the socket; its close code, and whether it was told a
                segment finished."""
                async with http.ws_connect(f"ws://127.0.0.1:{port}/push?session={name}") as ws:
                    await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
                    feed = asyncio.ensure_future(every_fifth_second(ws))
                    told = []
                    async for message in ws:
                        told.append(message.json()["type"])
                    feed.cancel()
                    closes.append((ws.close_code, "playback_finished" in told))

            async def every_fifth_second(ws: aiohttp.ClientWebSocketResponse) -> None:
                while not ws.closed:
                    await ws.send_bytes(b"\x00\x01" * 3200)
                    await asyncio.sleep(0.2)

            pushers = [asyncio.ensure_future(pushing(name)) for name in ("0", (await made.json())["id"])]
            await asyncio.sleep(3.0)
            processes = descendants(os.getpid()) - ours
            files = service_files(processes)
            os.kill(os.getpid(), signal.SIGINT)
            started = time.monotonic()
            code = await asyncio.wait_for(server, 30)
            seconds = time.monotonic() - started
            await asyncio.wait_for(asyncio.gather(*pushers), 5)
        return code, seconds, processes, files, closes

    code, seconds, processes, files, closes = asyncio.run(interrupted())
    assert code == 0 and seconds < 10, (code, seconds)
    assert closes == [(1001, True)] * 2, "each pusher told its segment's end, then why its socket closes"
    assert len(processes) >= 2 and any(f.startswith("/dev/shm/") for f in files), (processes, files)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in processes if running(pid)}
    assert left == {}, "a process of the service is left"
    assert [f for f in files if Path(f).exists()] == [], "a folder or ring of the service is left"
    for name in ("start.mp4", "start-1.mp4", "client.mp4"):
        with av.open(str(tmp_path / name)) as container:
            assert sum(1 for _ in container.decode(video=0)) >= 50, name


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (an exited one its parent has not reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_duration_counts_from_the_first_frame_out() -> None:
    """Issue 28: the CPU demo's 20 s were counted from start-up, so they were over before its first frame (136 s
    later)."""
    session = types.SimpleNamespace(output_stats={})
    service = types.SimpleNamespace(sessions={"0": session})

    async def run() -> float:
        waiting = asyncio.ensure_future(server_module._after_first_frame(service, 0.3))
        await asyncio.sleep(1.0)
        assert not waiting.done(), "no frame yet: the clock has not started"
        session.output_stats = {"frames_released": 1}
        started = time.monotonic()
        await asyncio.wait_for(waiting, 5)
        return time.monotonic() - started

    assert 0.2 < asyncio.run(run()) < 1.0


def test_a_busy_port_fails_in_one_line_before_the_engine_starts(capsys: pytest.CaptureFixture) -> None:
    port = free_port()
    options = synthetic(["--avatar", "anna.png", "--device", "cpu", "--http", f"127.0.0.1:{port}"], f"{RUNTIME}_slowly")
    with socket.create_server(("127.0.0.1", port)):
        started = time.monotonic()
        assert asyncio.run(server_module.serve(options)) == 1
        assert time.monotonic() - started < 2, "no engine was started to find out"
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        f"error: cannot serve on 127.0.0.1:{port}: Address already in use (another server there? use --http)"
    ]


def test_a_given_token_and_a_stream_key_are_never_printed(capsys: pytest.CaptureFixture) -> None:
    service = types.SimpleNamespace(
        core_info=types.SimpleNamespace(device="cpu"),
        options=types.SimpleNamespace(device="cpu"),
        budget=types.SimpleNamespace(capacity=lambda: {"admitted": 1, "runtime": 1, "outputs": 4}),
    )
    session = types.SimpleNamespace(id="0", preview=object(), push=True)
    first = SessionSpec(server_module.AVATAR_AT_START, rtmp=("rtmp://live.example/app/sk_live_secret",))
    at_start = server_module.SessionsAtStart(first)
    server_module._announce(at_start, "0.0.0.0", 8080, "given-s3cret", False, [session], service)
    printed = capsys.readouterr().err
    assert "given-s3cret" not in printed and "sk_live_secret" not in printed
    assert "?session=0&token=TOKEN" in printed and "rtmp://live.example/app/***" in printed
    assert "(CPU 1, outputs 4)" in printed, "a CPU server says CPU"
    server_module._announce(None, "0.0.0.0", 8080, "generated-s3cret", True, [], service)
    assert capsys.readouterr().err.count("generated-s3cret") == 1, "a generated token is printed once, for the operator"

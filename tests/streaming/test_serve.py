"""The server: loopback by default, a token beyond it, one name per session, and its wiring over the runtime contract."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import types

import aiohttp
import pytest

import streaming.serve as serve_module
from engine.controls import Controls
from engine.runtime.config import RuntimeConfig
from streaming.serve import is_loopback, numbered, parse_args, resolve_token
from tests.streaming.conftest import free_port
from tests.streaming.media import LiveReader
from tests.streaming.synthetic import SyntheticSession


def test_defaults_bind_loopback_and_demo_turns_on_the_preview() -> None:
    args = parse_args(["--avatar", "anna"])
    assert args.http == ("127.0.0.1", 8080) and args.webrtc is None
    assert args.encoder == "auto" and args.sessions == 1 and args.overlap == 75 and not args.no_admission
    demo = parse_args(["--demo"])
    assert demo.webrtc == ("127.0.0.1", 8080)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "--avatar is required"),
        (["--avatar", "a", "--audio", "x.wav", "--listen"], "not allowed with"),
        (["--demo", "--listen"], "takes no --audio"),
        (["--avatar", "a", "--webrtc", "8080"], "HOST:PORT"),
        (["--avatar", "a", "--sessions", "0"], "at least 1"),
        (["--avatar", "a", "--encoder", "vp8"], "invalid choice"),
    ],
)
def test_bad_command_lines_say_what_is_wrong(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_token_is_required_beyond_loopback() -> None:
    assert resolve_token("127.0.0.1", None) == (None, False)
    assert resolve_token("localhost", "given") == ("given", False)
    assert resolve_token("0.0.0.0", "given") == ("given", False)
    token, generated = resolve_token("0.0.0.0", None)
    assert generated and len(token) >= 16
    assert resolve_token("::", None)[1] and not is_loopback("192.0.2.7") and is_loopback("::1")


def test_each_session_gets_its_own_url_and_file() -> None:
    assert numbered("rtmp://h/live/key", 0, 3) == "rtmp://h/live/key"
    assert numbered("rtmp://h/live/key", 2, 3) == "rtmp://h/live/key-2"
    assert numbered("out/rec.mp4", 1, 2) == "out/rec-1.mp4"
    assert numbered("out/rec.mp4", 1, 1) == "out/rec.mp4"


class SyntheticRuntime:
    """The serving runtime's contract (Runtime.from_checkpoints / open_session / close) over synthetic sessions."""

    opened: list[SyntheticSession] = []
    closed = False
    default_controls = Controls()

    config = None

    @classmethod
    def from_checkpoints(cls, checkpoints=None, device=None, steps=25, config=None) -> SyntheticRuntime:
        cls.opened, cls.closed, cls.config = [], False, config
        return cls()

    def open_session(self, avatar, live: bool, overlap: int, seed: int, controls: Controls) -> SyntheticSession:
        assert live and overlap == 75 and avatar == "anna" and controls == Controls(yaw=-4.0, emotion="happy")
        self.opened.append(SyntheticSession(128, 128))
        return self.opened[-1]

    def metrics(self) -> dict:
        return {"ticks": 7, "tick_wall_ms_p50": 3.5, "gpu_busy": None}

    def close(self) -> None:
        type(self).closed = True


@pytest.mark.slow
def test_serve_wires_sessions_to_rtmp_push_and_metrics_and_ends_with_them(nginx_rtmp, monkeypatch) -> None:
    """Everything but the model: two sessions, RTMP per session, push per session; ending both ends the server."""
    monkeypatch.setitem(sys.modules, "engine.runtime", types.SimpleNamespace(Runtime=SyntheticRuntime, RuntimeConfig=RuntimeConfig))
    monkeypatch.setattr(serve_module, "load_avatar", lambda args, device, random_weights: "anna")
    port = free_port()
    args = parse_args(
        ["--avatar", "anna", "--sessions", "2", "--listen", "--encoder", "x264", "--device", "cpu", "--no-admission"]
        + ["--rtmp", nginx_rtmp.url("show"), "--http", f"127.0.0.1:{port}", "--yaw", "-4", "--emotion", "happy"]
    )
    readers = []

    async def drive() -> dict:
        server = asyncio.ensure_future(serve_module.serve(args))
        async with aiohttp.ClientSession() as http:

            async def metrics() -> str:
                with contextlib.suppress(aiohttp.ClientError):
                    response = await http.get(f"http://127.0.0.1:{port}/metrics")
                    if response.status == 200:
                        return await response.text()
                return ""

            for _ in range(200):
                if 'ditto_rtmp_connected{session="1"} 1.0' in await metrics():
                    break
                await asyncio.sleep(0.05)
            readers.append(LiveReader(nginx_rtmp.url("show-1"), read_timeout=2.0))
            await asyncio.sleep(3.0)  # more than one 2 s GOP: the reader starts at the next IDR
            text = await metrics()
            for name in ("0", "1"):
                async with http.ws_connect(f"ws://127.0.0.1:{port}/push?session={name}") as ws:
                    await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
                    assert (await ws.receive_json(timeout=5))["type"] == "ready"
                    await ws.send_bytes(b"\x00\x01" * 1600)
                    await ws.send_json({"type": "end"})
                    assert await ws.receive_json(timeout=5) == {"type": "ended"}
        assert await asyncio.wait_for(server, 30) == 0
        return {"metrics": text}

    result = asyncio.run(drive())
    assert 'ditto_sessions 2.0' in result["metrics"]
    assert 'ditto_frames_sent_total{session="1",sink="rtmp"}' in result["metrics"]
    assert "ditto_runtime_tick_wall_ms_p50 3.5" in result["metrics"] and "ditto_runtime_gpu_busy" not in result["metrics"]
    assert SyntheticRuntime.config is not None and SyntheticRuntime.config.admission is False
    assert [len(s.pushed) for s in SyntheticRuntime.opened] == [1, 1]
    assert all(s.ended for s in SyntheticRuntime.opened) and SyntheticRuntime.closed
    got = readers[0].join()
    assert got.size == (128, 128) and len(got.indices) >= 20, got.error
    assert got.indices == list(range(got.indices[0], got.indices[0] + len(got.indices)))

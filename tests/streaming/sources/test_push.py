"""WebSocket push for TTS engines: declared formats, bad messages answered with an error while the stream goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from engine.controls import Controls
from streaming.output import SessionOutput
from streaming.sources.push import MAX_CONTROL_DEPTH, MAX_MESSAGE_SECONDS
from tests.serving.inprocess import Stream, create_app
from tests.streaming.synthetic import SyntheticSession
from tests.streaming.test_output import Recorder


async def until(condition, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


@contextlib.asynccontextmanager
async def pushing_server() -> AsyncIterator[tuple[SyntheticSession, SessionOutput, Recorder, TestClient]]:
    """A served session with push enabled, its x264 output recorded; everything stopped on the way out."""
    session = SyntheticSession(64, 64)
    output = SessionOutput(session, encoder="x264")
    recorder = Recorder()
    output.add_sink(recorder)
    output.start()
    client = TestClient(TestServer(create_app([Stream("0", session, output, push=True)])))
    await client.start_server()
    try:
        yield session, output, recorder, client
    finally:
        await client.close()
        session.end()
        await asyncio.to_thread(output.stop)


def test_the_push_protocol_end_to_end() -> None:
    async def scenario() -> None:
        async with pushing_server() as (session, output, recorder, client):
            ws = await client.ws_connect("/push?session=0")

            async def error_for(message) -> str:
                await (ws.send_bytes(message) if isinstance(message, bytes) else ws.send_str(message))
                reply = await ws.receive_json(timeout=5)
                assert reply["type"] == "error", reply
                return reply["message"]

            await until(lambda: len(recorder.frames) > 0)
            frames_before = len(recorder.frames)
            assert "format" in await error_for(b"\x00\x00" * 100)
            assert "JSON" in await error_for("not json")
            assert "expected format, controls, end_of_segment, interrupt or end" in await error_for(
                json.dumps({"type": "dance"})
            )
            assert "outside" in await error_for(json.dumps({"type": "format", "sample_rate": 5}))
            assert "8000..192000" in await error_for(json.dumps({"type": "format", "sample_rate": 4000}))
            assert "number of Hz" in await error_for(json.dumps({"type": "format", "sample_rate": "24k"}))
            assert "channels" in await error_for(json.dumps({"type": "format", "sample_rate": 16000, "channels": 0}))
            assert "encoding" in await error_for(
                json.dumps({"type": "format", "sample_rate": 16000, "encoding": "mp3"})
            )

            await ws.send_str(json.dumps({"type": "format", "sample_rate": 24000, "channels": 1, "encoding": "s16le"}))
            assert await ws.receive_json(timeout=5) == {
                "type": "ready",
                "sample_rate": 24000,
                "channels": 1,
                "encoding": "s16le",
                "latency": "faithful",
            }
            assert "whole sample frames" in await error_for(b"\x01\x02\x03")
            await ws.send_bytes(np.full(2400, 16384, "<i2").tobytes())
            await until(lambda: len(session.pushed) == 1)
            pcm, rate, channels = session.pushed[0]
            assert rate == 24000 and channels is None and pcm.shape == (2400,) and np.allclose(pcm, 0.5)

            await ws.send_str(json.dumps({"type": "format", "sample_rate": 16000, "channels": 2, "encoding": "f32le"}))
            assert (await ws.receive_json(timeout=5))["type"] == "ready"
            stereo = np.stack([np.full(800, 0.2, "<f4"), np.full(800, 0.4, "<f4")], axis=1)
            stereo[10, 1] = np.nan
            assert "NaN" in await error_for(stereo.tobytes())
            stereo[10, 1] = 0.4
            await ws.send_bytes(stereo.tobytes())
            await until(lambda: len(session.pushed) == 2)
            assert np.allclose(session.pushed[1][0], 0.3) and session.pushed[1][1] == 16000

            await ws.send_str(json.dumps({"type": "interrupt"}))
            assert await ws.receive_json(timeout=5) == {"type": "interrupted", "segment": None}
            assert session.interrupts == 1
            await until(lambda: len(recorder.frames) > frames_before + 5)  # frames kept flowing through all of this

            await ws.send_str(json.dumps({"type": "end"}))
            assert await ws.receive_json(timeout=5) == {"type": "ended"}
            await ws.receive(timeout=5)
            assert ws.closed and session.ended
            assert await asyncio.to_thread(output.finished.wait, 10), "ending the input ends the stream"

    asyncio.run(scenario())


def test_sessions_without_push_refuse_it() -> None:
    async def scenario() -> None:
        session = SyntheticSession(64, 64, frames=1)
        client = TestClient(TestServer(create_app([Stream("0", session, SessionOutput(session))])))
        await client.start_server()
        try:
            response = await client.get("/push?session=0")
            assert response.status == 404 and "--listen" in await response.text()
            response = await client.get("/push?session=7")
            assert response.status == 404 and "no session '7'" in await response.text()
        finally:
            await client.close()

    asyncio.run(scenario())


def test_controls_messages_change_the_sessions_controls_and_bad_ones_change_nothing() -> None:
    async def scenario() -> None:
        async with pushing_server() as (session, output, recorder, client):
            ws = await client.ws_connect("/push?session=0")
            await until(lambda: len(recorder.frames) > 0)
            frames_before = len(recorder.frames)
            await ws.send_json({"type": "controls", "yaw": 10, "emotion": "Happy", "fix_kp_cond_dims": [0, 202]})
            assert await ws.receive_json(timeout=5) == {
                "type": "controls",
                "applied": {"yaw": 10.0, "emotion": "happy", "fix_kp_cond_dims": [0, 202]},
            }
            assert session.controls == Controls(yaw=10.0, emotion="happy", fix_kp_cond_dims=(0, 202))
            table = [[0.0] * 63, [0.01] * 63]
            await ws.send_json({"type": "controls", "blink_table": table, "emotion": [[0.5, 0, 0, 0.5, 0, 0, 0, 0]]})
            reply = await ws.receive_json(timeout=5)
            assert reply["applied"]["blink_table"] == table and session.controls.yaw == 10.0
            for message, error in [
                ({"yaw": 200}, "yaw must be within [-90, 90], got 200.0"),
                ({"yaw": 5, "emotion": "bored"}, "unknown emotion 'bored'"),
                ({"nod": True}, "unknown control(s) nod; controls are: pitch, yaw"),
                ({"expression": [0.0] * 62}, "expression must be 63 values"),
            ]:
                await ws.send_json({"type": "controls", **message})
                reply = await ws.receive_json(timeout=5)
                assert reply["type"] == "error" and error in reply["message"], reply
            assert session.controls.yaw == 10.0, "a message with one bad field changes nothing"
            await until(lambda: len(recorder.frames) > frames_before + 5)  # the stream went on
            await ws.send_json({"type": "end"})
            assert await ws.receive_json(timeout=5) == {"type": "ended"}

    asyncio.run(scenario())


def test_after_the_session_ended_a_websocket_client_is_told_what_to_do() -> None:
    """The runtime's SessionClosed names runtime.open_session, which a WebSocket client cannot call: it is told the HTTP
    way."""
    from aiohttp import web

    from engine.runtime import SessionClosed
    from streaming.sources.push import push_handler

    class Ended:
        async def interrupt(self) -> None:
            raise SessionClosed("session 3 has ended; open a new one with runtime.open_session")

        def subscribe(self, listener):
            return lambda: None

    async def scenario() -> None:
        app = web.Application()

        async def push(request: web.Request) -> web.WebSocketResponse:
            return await push_handler(request, Ended())

        app.router.add_get("/push", push)
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            ws = await client.ws_connect("/push?session=anna")
            await ws.send_json({"type": "interrupt"})
            reply = await ws.receive_json(timeout=5)
            assert reply["type"] == "error" and "runtime.open_session" not in reply["message"], reply
            assert "'anna' has ended" in reply["message"] and "POST /sessions" in reply["message"], reply
        finally:
            await client.close()

    asyncio.run(scenario())


class RealTimeSession:
    """A session's audio side as the service's is: it takes pushed audio no faster than real time (in 0.1 s steps)."""

    latency = "faithful"

    def __init__(self) -> None:
        self.samples, self.rate = 0, 1
        self.interrupts: list[float] = []

    @property
    def taken(self) -> float:
        """Seconds of audio taken so far (counted in samples: no rounding piles up over the steps)."""
        return self.samples / self.rate

    async def push_audio(self, pcm: np.ndarray, sample_rate: int) -> None:
        self.rate = sample_rate
        for start in range(0, pcm.size, sample_rate // 10):
            await asyncio.sleep(0.1)
            self.samples += min(pcm.size - start, sample_rate // 10)

    async def update_controls(self, **changes) -> dict:
        return {name: value for name, value in Controls().replace(**changes).to_dict().items() if name in changes}

    async def interrupt(self) -> int | None:
        self.interrupts.append(self.taken)
        return 0

    async def end_segment(self) -> int | None:
        return 0

    async def end(self) -> None:
        return None

    def subscribe(self, listener):
        return lambda: None


@contextlib.asynccontextmanager
async def pushing_to(session) -> AsyncIterator:
    """A WebSocket connected to ``session`` through the push handler; closed on the way out."""
    from aiohttp import web

    from streaming.sources.push import push_handler

    async def push(request: web.Request) -> web.WebSocketResponse:
        return await push_handler(request, session)

    app = web.Application()
    app.router.add_get("/push", push)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        ws = await client.ws_connect("/push?session=anna")
        await ws.send_json({"type": "format", "sample_rate": 16000, "channels": 1, "encoding": "s16le"})
        assert (await ws.receive_json(timeout=5))["type"] == "ready"
        yield ws
    finally:
        await client.close()


def test_an_interrupt_behind_a_long_message_is_answered_at_once_and_drops_the_rest_of_it() -> None:
    async def scenario() -> None:
        session = RealTimeSession()
        async with pushing_to(session) as ws:
            await ws.send_bytes(np.zeros(8 * 16000, "<i2").tobytes())
            await asyncio.sleep(0.3)
            started = time.monotonic()
            await ws.send_json({"type": "interrupt"})
            assert await ws.receive_json(timeout=5) == {"type": "interrupted", "segment": 0}
            assert time.monotonic() - started < 1.0, "the interrupt waited for the message ahead of it"
            assert session.interrupts and session.interrupts[0] < 1.0
            await asyncio.sleep(0.3)
            assert session.taken < 1.0, "what the session had not taken of the message was dropped"

            await ws.send_bytes(np.zeros(16000 // 2, "<i2").tobytes())
            await ws.send_json({"type": "end_of_segment"})
            assert await ws.receive_json(timeout=5) == {"type": "end_of_segment", "segment": 0}
            assert session.taken >= session.interrupts[0] + 0.5, "a segment closes after its audio, in order"

    asyncio.run(scenario())


def test_one_binary_message_holds_at_most_its_limit_of_audio() -> None:
    async def scenario() -> None:
        session = RealTimeSession()
        async with pushing_to(session) as ws:
            await ws.send_bytes(np.zeros(60 * 16000, "<i2").tobytes())
            reply = await ws.receive_json(timeout=5)
            assert reply["type"] == "error" and f"at most {MAX_MESSAGE_SECONDS:g} s of audio" in reply["message"], reply
            assert "got 60.0 s: send it in pieces" in reply["message"] and session.taken == 0

    asyncio.run(scenario())


def test_malformed_control_messages_are_answered_with_errors_and_the_stream_goes_on() -> None:
    async def scenario() -> None:
        async with pushing_to(RealTimeSession()) as ws:
            for text, error in [
                (json.dumps({"type": "format", "sample_rate": 16000, "encoding": []}), "encoding must be one of"),
                (json.dumps({"type": "format", "sample_rate": 16000, "encoding": {}}), "encoding must be one of"),
                (json.dumps({"type": "format", "sample_rate": 1e23}), "outside 8000..192000 Hz"),
                (json.dumps({"type": "format", "sample_rate": 2**70}), "outside 8000..192000 Hz"),
                ('{"type": "controls", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
                ('{"type": "controls", "emotion": ' + "[" * 9 + "]" * 9 + "}", f"nested more than {MAX_CONTROL_DEPTH}"),
                (json.dumps({"type": "controls", "self": 1}), "unknown control(s) self"),
                (json.dumps({"type": "controls", "fade_in": 2**70}), "fade_in must be a whole number of frames"),
            ]:
                await ws.send_str(text)
                reply = await ws.receive_json(timeout=5)
                assert reply["type"] == "error" and error in reply["message"], (text[:80], reply)
            await ws.send_json({"type": "controls", "yaw": 10})
            assert await ws.receive_json(timeout=5) == {"type": "controls", "applied": {"yaw": 10.0}}

    asyncio.run(scenario())


def test_the_last_message_of_a_client_that_leaves_is_still_taken_whole() -> None:
    async def scenario() -> None:
        session = RealTimeSession()
        async with pushing_to(session) as ws:
            await ws.send_bytes(np.zeros(16000, "<i2").tobytes())
            await ws.close()
            await until(lambda: session.taken > 0.999, seconds=5)

    asyncio.run(scenario())


def test_audio_pushed_seconds_ahead_in_many_messages_still_lets_an_interrupt_through_at_once() -> None:
    """A TTS pre-fills faster than real time: the connection reads its messages ahead of the session, so an interrupt
    behind several of them is answered at once and drops them all."""

    async def scenario() -> None:
        session = RealTimeSession()
        async with pushing_to(session) as ws:
            for _ in range(4):
                await ws.send_bytes(np.zeros(2 * 16000, "<i2").tobytes())
            await asyncio.sleep(0.3)
            started = time.monotonic()
            await ws.send_json({"type": "interrupt"})
            assert await ws.receive_json(timeout=5) == {"type": "interrupted", "segment": 0}
            assert time.monotonic() - started < 0.5, "the interrupt waited behind queued audio"
            await asyncio.sleep(0.3)
            assert session.taken < 1.0, "the queued messages were dropped with the one being taken"

    asyncio.run(scenario())


def test_a_client_past_the_read_ahead_limit_is_told_once_and_slowed_and_loses_nothing(monkeypatch) -> None:
    import streaming.sources.push

    limit = 1.0  # the rule at a smaller scale, so that the session takes it all in seconds
    monkeypatch.setattr(streaming.sources.push, "MAX_QUEUED_SECONDS", limit)

    async def scenario() -> None:
        session = RealTimeSession()
        async with pushing_to(session) as ws:
            pieces = 6
            for _ in range(pieces):
                await ws.send_bytes(np.zeros(16000 // 4, "<i2").tobytes())
            reply = await ws.receive_json(timeout=5)
            assert reply == {"type": "ahead_limit", "queued_seconds": limit, "limit_seconds": limit}, reply
            await ws.send_json({"type": "end_of_segment"})
            assert await ws.receive_json(timeout=5) == {"type": "end_of_segment", "segment": 0}
            assert session.taken == pieces / 4, "every message was taken, in order, before the segment closed"

    asyncio.run(scenario())

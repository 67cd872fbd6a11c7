"""LiveKit rooms as an output of the service, with no LiveKit server (none installs here).

The service's own pieces run as in production (``room_service``: the engine core on the synthetic runtime and an
output worker over their real sockets and shared memory, the test as their front end). Only the room's connection is
left out: the room output takes the agent's audio from a ``QueueAudioOutput``, the real livekit-agents class that is
both an agent's audio output and an avatar's receiver, so the agent's side (capture, flush, clear,
``wait_for_playout``) is LiveKit's own, and the frames go to LiveKit's real audio and video sources. The last tests
run the service's processes as ``apps.serve`` does: a bad ``livekit`` field is a 400 naming it, a room that cannot be
joined a 502 and no session left behind. (Byte streams and RPCs: ``test_livekit_streams.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT

pytest.importorskip("livekit.agents", reason=INTEGRATIONS_HINT)

import aiohttp
from aiohttp import web

from integrations.livekit_avatar import DittoAvatarSession
from integrations.livekit_compat import LiveSession
from serving.http import create_service_app
from serving.processes import ServiceOptions
from serving.protocol import OutputFailed
from serving.service import Service
from streaming.encoders.room_cost import ROOM
from tests.integrations.loopback_room import room_pair
from tests.integrations.room_service import RUNTIME, call, harness, say, speech, until
from tests.streaming.conftest import free_port
from tests.streaming.synthetic_runtime import AVATARS


def test_a_room_session_plays_speech_reports_it_once_and_a_clear_is_answered_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            session_id, side, room = await h.open()
            agent = side.audio
            stream = h.worker.streams[session_id]
            await until(lambda: room.counters["frames_sent"] >= 10)
            assert stream.output.encoder.name == "raw", "a room-only session encodes no H.264"
            sent, started = room.counters["frames_sent"], time.monotonic()
            await asyncio.sleep(1.0)
            rate = (room.counters["frames_sent"] - sent) / (time.monotonic() - started)
            assert rate == pytest.approx(25, abs=3), "pictures reach the room's tracks at 25 fps"

            await h.on_rooms(say(agent, 0.4))
            done = await h.on_rooms(asyncio.wait_for(agent.wait_for_playout(), 5))
            assert not done.interrupted and done.playback_position == pytest.approx(0.4, abs=0.041)
            assert [e[0] for e in agent.events] == ["started", "finished"]

            await h.on_rooms(say(agent, 3.0))
            await until(lambda: len(agent.events) == 3)  # this segment has started playing
            await asyncio.sleep(0.3)
            cleared = time.monotonic()
            await h.on_rooms(call(agent.clear_buffer))
            done = await h.on_rooms(asyncio.wait_for(agent.wait_for_playout(), 2))
            assert time.monotonic() - cleared < 0.5, "answered at once, well within the agent's 2 s"
            assert done.interrupted and 0.2 < done.playback_position < 1.5, done
            await asyncio.sleep(1.0)
            cut = room.counters["frames_cut"]
            assert 0 < cut < 25, "speech already on its way shows as idle, the rest was dropped by the session"
            await asyncio.sleep(0.4)
            assert room.counters["frames_cut"] == cut, "no speech of the cut segment comes after"
            assert len(agent.finished()) == 2

            await h.on_rooms(say(agent, 0.2))
            done = await h.on_rooms(asyncio.wait_for(agent.wait_for_playout(), 5))
            assert not done.interrupted and done.playback_position == pytest.approx(0.2, abs=0.041), "speaks again"

            h.left[session_id]("the avatar left the room 'local' (ROOM_DELETED)")
            failed = await h.event(OutputFailed)
            assert failed.sink == "livekit" and "ROOM_DELETED" in failed.message, "the front end hears the room is gone"

    asyncio.run(scenario())


def test_exactly_one_playback_finished_per_segment_under_random_interruptions(tmp_path: Path) -> None:
    """Segments of random length, each played out, cleared at a random moment (before, during or after its first
    frame, mid-capture or after its flush, twice in a row), or paused and then resumed or cleared: the agent hears
    exactly one ``playback_finished`` for each, within its 2 s of a clear, and nothing more afterwards."""
    rng = random.Random(37)

    async def scenario() -> None:
        async with harness(tmp_path) as h:
            _, side, room = await h.open()
            agent = side.audio
            expected = []
            for k in range(24):
                kind = rng.choice(
                    ["natural", "clear", "clear_mid_capture", "clear_twice", "pause_resume", "pause_clear"]
                )

                async def segment(kind: str = kind) -> None:
                    frames = speech(rng.uniform(0.04, 0.4))
                    for i, frame in enumerate(frames):
                        await agent.capture_frame(frame)
                        if kind == "clear_mid_capture" and i == len(frames) // 2:
                            agent.clear_buffer()
                            break
                    agent.flush()
                    if kind in ("clear", "clear_twice"):
                        await asyncio.sleep(rng.uniform(0, 0.4))
                        agent.clear_buffer()
                        if kind == "clear_twice":
                            agent.clear_buffer()
                    if kind.startswith("pause"):
                        await asyncio.sleep(rng.uniform(0, 0.3))
                        room.pause()
                        await asyncio.sleep(rng.uniform(0, 0.3))
                        room.resume() if kind == "pause_resume" else agent.clear_buffer()
                    await asyncio.wait_for(agent.wait_for_playout(), 2.0)

                try:
                    await h.on_rooms(segment())
                except TimeoutError:
                    pytest.fail(f"segment {k} ({kind}) got no playback_finished within 2 s")
                expected.append(kind)
                assert len(agent.finished()) == k + 1, f"segment {k} ({kind}): {agent.finished()[-3:]}"
            await asyncio.sleep(0.5)
            assert len(agent.finished()) == len(expected), "none extra afterwards"
            naturals = [e for kind, e in zip(expected, agent.finished()) if kind in ("natural", "pause_resume")]
            assert naturals and not any(interrupted for _, _, interrupted in naturals)
            assert room.counters["clears"] >= sum("clear" in kind for kind in expected)

    asyncio.run(scenario())


def test_a_pause_holds_the_speech_and_the_resume_speaks_on_from_where_it_stopped(tmp_path: Path) -> None:
    """A false interruption: the agent pauses its speech (the avatar idles), then resumes it; the segment is spoken
    whole, once, and answered once with its whole length. A pause that turns out real ends with a clear."""

    async def scenario() -> None:
        async with harness(tmp_path) as h:
            _, side, room = await h.open()
            agent = side.audio
            await h.on_rooms(say(agent, 2.0))
            await until(lambda: agent.events)  # playing
            await asyncio.sleep(0.5)
            await h.on_rooms(call(room.pause))
            await asyncio.sleep(0.6)  # the speech already on its way is cut
            spoken = room.counters["speech_frames_sent"]
            await asyncio.sleep(0.8)
            assert room.counters["speech_frames_sent"] == spoken, "paused: the avatar idles"
            assert 5 < spoken < 40 and not agent.finished(), "held, not finished"
            await h.on_rooms(call(room.resume))
            done = await h.on_rooms(asyncio.wait_for(agent.wait_for_playout(), 5))
            assert not done.interrupted and done.playback_position == pytest.approx(2.0, abs=0.09), done
            assert room.counters["speech_frames_sent"] == pytest.approx(50, abs=2), "every frame of it spoken once"
            assert [e[0] for e in agent.events] == ["started", "finished"]

            await h.on_rooms(say(agent, 2.0))
            await until(lambda: len(agent.events) == 3)
            await h.on_rooms(call(room.pause))
            await asyncio.sleep(0.3)
            await h.on_rooms(call(agent.clear_buffer))
            done = await h.on_rooms(asyncio.wait_for(agent.wait_for_playout(), 2))
            assert done.interrupted and len(agent.finished()) == 2
            await h.on_rooms(say(agent, 0.4))
            done = await h.on_rooms(asyncio.wait_for(agent.wait_for_playout(), 5))
            assert not done.interrupted and done.playback_position == pytest.approx(0.4, abs=0.041), "speaks again"

    asyncio.run(scenario())


@contextlib.asynccontextmanager
async def service() -> AsyncIterator[tuple[Service, aiohttp.ClientSession, str]]:
    """The service's processes (front end here, core and worker as processes) on the synthetic runtime."""
    served = Service(ServiceOptions(workers=1, runtime=RUNTIME, avatars={"anchor": "anchor"}))
    await served.start()
    runner = web.AppRunner(create_service_app(served))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as http:
            yield served, http, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await served.close()


def test_a_bad_livekit_field_is_a_400_naming_it_and_a_room_not_joined_a_502_leaving_no_session() -> None:
    """Over the service's HTTP API; the last two requests are the agent's ``DittoAvatarSession.start``, whose
    ``latency`` goes into the session's request (a bad one is the service's 400 naming it, ``low`` is taken and the
    service goes on to join the room)."""

    async def scenario() -> None:
        async with service() as (_, http, base):
            good = {"url": "ws://127.0.0.1:1", "token": "a.b.c"}
            for livekit, says in [
                ("wss://x", '"livekit" is an object'),
                ({**good, "url": "rtmp://x"}, '"livekit.url"'),
                ({**good, "token": 7}, '"livekit.token"'),
                ({**good, "room": "r"}, "unknown field(s) ['room']"),
            ]:
                answer = await http.post(f"{base}/sessions", json={"avatar": "anchor", "livekit": livekit})
                assert answer.status == 400 and says in (await answer.json())["error"], (livekit, await answer.text())
            nobody = f"ws://127.0.0.1:{free_port()}"
            for latency, says in [("fastest", '(400): "latency" is one of faithful, low'), ("low", "(502)")]:
                avatar = DittoAvatarSession(base, livekit_url=nobody, api_key="k", api_secret="s" * 32, latency=latency)
                started = time.monotonic()
                with pytest.raises(RuntimeError) as refused:
                    await avatar.start(LiveSession(), room_pair()[0])
                await avatar.aclose()
                assert says in str(refused.value), refused.value
                assert time.monotonic() - started < 20
            assert "could not join the LiveKit room" in str(refused.value)
            listing = await (await http.get(f"{base}/sessions")).json()
            assert listing["sessions"] == [], "a session whose avatar could not join is ended and not listed"

    asyncio.run(scenario())


def test_admission_counts_a_room_s_encoding_and_refuses_a_room_the_outputs_cannot_carry() -> None:
    """A room is encoded in the output worker (LiveKit's VP8): its cost is measured there, and a session whose room
    (and stream, if it has one) the outputs' budget cannot carry is a 503 before any room is joined."""

    async def scenario() -> None:
        async with service() as (served, http, base):
            width, height = AVATARS.get("anchor", (128, 128))
            measured = await served.budget.cost_ms(width, height, ROOM)
            listing = await (await http.get(f"{base}/sessions")).json()
            assert measured > 0 and listing["encoding"]["costs"][f"{width}x{height} livekit"] == measured
            budget = served.budget
            dear = budget.costs[width, height, ROOM] = budget.budget_ms() + 1.0  # as a far slower core measures it
            stream = await served.budget.cost_ms(width, height, "veryfast")
            room = {"url": f"ws://127.0.0.1:{free_port()}", "token": "a.b.c"}
            for body, says in [
                ({"avatar": "anchor", "livekit": room}, f"a {width}x{height} LiveKit room costs {dear:.1f} ms"),
                (
                    {"avatar": "anchor", "livekit": room, "preview": True},
                    f"a {width}x{height} veryfast stream and LiveKit room costs {stream + dear:.1f} ms",
                ),
            ]:
                started = time.monotonic()
                answer = await http.post(f"{base}/sessions", json=body)
                assert answer.status == 503 and says in (await answer.json())["error"], await answer.text()
                assert time.monotonic() - started < 2, "refused before the avatar tries to join"
            assert (await (await http.get(f"{base}/sessions")).json())["sessions"] == []

    asyncio.run(scenario())

"""End to end through a real LiveKit server (``livekit-server --dev``): the agent's ``DittoAvatarSession`` asks the
service for a session in its room, the service's output worker joins as the avatar and publishes its pictures, the
agent's audio reaches the session as a data stream and comes back as ``lk.playback_started``/``lk.playback_finished``
RPCs, plain, paused and resumed, and interrupted; deleting the room ends the session, and ``GET`` says why.

Runs only when ``LIVEKIT_URL`` is set (``LIVEKIT_API_KEY``/``LIVEKIT_API_SECRET``, default the dev server's
devkey/secret); no LiveKit server installs from the registries these machines reach. The service's core runs the
synthetic runtime: what is tested here is the room protocol, not the model.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT, REPO

pytest.importorskip("livekit.agents", reason=INTEGRATIONS_HINT)
if not os.environ.get("LIVEKIT_URL"):
    pytest.skip(
        "LIVEKIT_URL is not set: run `livekit-server --dev` and set LIVEKIT_URL=ws://127.0.0.1:7880",
        allow_module_level=True,
    )

import aiohttp
from livekit import api, rtc

from integrations.livekit_avatar import DittoAvatarSession
from integrations.livekit_compat import LiveSession
from tests.integrations.synthetic_service import start, stop
from tests.streaming.conftest import free_port

URL = os.environ.get("LIVEKIT_URL", "")
KEY = os.environ.get("LIVEKIT_API_KEY", "devkey")
SECRET = os.environ.get("LIVEKIT_API_SECRET", "secret")
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RATE = 24_000
SIZE = (128, 128)
"""The synthetic service's ``anchor`` frames."""


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    """The service's processes (front end, engine core on the synthetic runtime, an output worker)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "tests.integrations.synthetic_service", str(port), TOKEN]
    process = start(command, url, env, 60, AUTH)
    yield url
    stop(process)


def speech(seconds: float) -> list[rtc.AudioFrame]:
    chunk = RATE // 50
    pcm = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(seconds * RATE)) / RATE) * 32767).astype(np.int16)
    return [rtc.AudioFrame(pcm[i : i + chunk].tobytes(), RATE, 1, chunk) for i in range(0, pcm.size, chunk)]


async def session_state(url: str, session_id: str) -> dict:
    async with aiohttp.ClientSession(headers=AUTH) as http, http.get(f"{url}/sessions/{session_id}") as answer:
        return await answer.json()


def test_an_agent_talks_through_the_service_s_avatar_in_a_livekit_room(service_url: str) -> None:
    async def scenario() -> None:
        room_name = f"ditto-{secrets.token_hex(3)}"
        token = (
            api.AccessToken(KEY, SECRET)
            .with_identity("agent")
            .with_kind("agent")
            .with_grants(api.VideoGrants(room_join=True, room=room_name, room_admin=True))
            .to_jwt()
        )
        room = rtc.Room()
        frames_seen = asyncio.Event()

        @room.on("track_subscribed")
        def on_track(track, publication, participant) -> None:
            if track.kind == rtc.TrackKind.KIND_VIDEO and participant.identity == "ditto-avatar":

                async def read() -> None:
                    count = 0
                    async for event in rtc.VideoStream(track):
                        assert (event.frame.width, event.frame.height) == SIZE
                        count += 1
                        if count >= 10:
                            frames_seen.set()
                            return

                asyncio.ensure_future(read())

        await room.connect(URL, token)
        agent = LiveSession()
        avatar = DittoAvatarSession(service_url, token=TOKEN, livekit_url=URL, api_key=KEY, api_secret=SECRET)
        try:
            await avatar.start(agent, room)
            shown = await session_state(service_url, avatar.session_id)
            assert shown["outputs"]["livekit"] == {"url": URL, "room": room_name, "identity": "ditto-avatar"}
            await avatar.wait_for_join(timeout=20)
            await asyncio.wait_for(frames_seen.wait(), 20)
            audio = agent.output.audio
            for frame in speech(0.4):
                await audio.capture_frame(frame)
            audio.flush()
            done = await asyncio.wait_for(audio.wait_for_playout(), 10)
            assert not done.interrupted and done.playback_position == pytest.approx(0.4, abs=0.1)
            assert audio.can_pause, "the avatar's audio output can pause (false interruptions)"
            for frame in speech(2.0):
                await audio.capture_frame(frame)
            audio.flush()
            await asyncio.sleep(0.8)
            audio.pause()
            await asyncio.sleep(0.5)
            audio.resume()
            done = await asyncio.wait_for(audio.wait_for_playout(), 10)
            assert not done.interrupted and done.playback_position == pytest.approx(2.0, abs=0.2), "spoken on, whole"
            for _ in range(3):
                for frame in speech(1.0):
                    await audio.capture_frame(frame)
                audio.clear_buffer()
                audio.flush()
                cleared = time.monotonic()
                done = await asyncio.wait_for(audio.wait_for_playout(), 10)
                assert done.interrupted, "each interrupted segment is answered, several in a row"
                assert time.monotonic() - cleared < 2.0, "within the agent's clear_buffer_timeout"

            async with api.LiveKitAPI(URL.replace("ws", "http", 1), KEY, SECRET) as lk:
                await lk.room.delete_room(api.DeleteRoomRequest(room=room_name))
            deadline = time.monotonic() + 10
            while (shown := await session_state(service_url, avatar.session_id))["state"] != "ended":
                assert time.monotonic() < deadline, f"the session outlived its room: {shown['state']}"
                await asyncio.sleep(0.2)
            assert "ROOM_DELETED" in shown["error"] and room_name in shown["error"], shown["error"]
        finally:
            await avatar.aclose()
            await room.disconnect()

    asyncio.run(scenario())

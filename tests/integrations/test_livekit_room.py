"""End to end through a real LiveKit server (``livekit-server --dev``): the agent's ``DittoAvatarSession`` asks the
avatar worker for a session in its room, the worker joins and publishes video, the agent's audio reaches it as a
data stream and comes back as ``lk.playback_finished`` RPCs, plain and interrupted.

Runs only when ``LIVEKIT_URL`` is set (``LIVEKIT_API_KEY``/``LIVEKIT_API_SECRET``, default the dev server's
devkey/secret); no LiveKit server installs from the registries these machines reach. The worker's sessions are
the fast synthetic ones: what is tested here is the room protocol, not the model.
"""

from __future__ import annotations

import asyncio
import os
import secrets

import numpy as np
import pytest
import torch

from tests.integrations.conftest import INTEGRATIONS_HINT

pytest.importorskip("livekit.agents", reason=INTEGRATIONS_HINT)
if not os.environ.get("LIVEKIT_URL"):
    pytest.skip("LIVEKIT_URL is not set: run `livekit-server --dev` and set LIVEKIT_URL=ws://127.0.0.1:7880", allow_module_level=True)

from aiohttp import web
from livekit import api, rtc
from livekit.agents import AgentSession

from integrations.livekit_avatar import AvatarWorker, DittoAvatarSession
from tests.integrations.fast_session import SIZE, FastSession, portrait
from tests.streaming.conftest import free_port

URL = os.environ.get("LIVEKIT_URL", "")
KEY = os.environ.get("LIVEKIT_API_KEY", "devkey")
SECRET = os.environ.get("LIVEKIT_API_SECRET", "secret")
RATE = 24_000


class FastRuntime:
    def open_session(self, avatar, live: bool, latency: str) -> FastSession:
        return FastSession()


class Avatar:
    frames = torch.from_numpy(portrait())[None]


class Avatars:
    def get(self, name: str) -> Avatar:
        return Avatar()


def speech(seconds: float) -> list[rtc.AudioFrame]:
    chunk = RATE // 50
    pcm = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(seconds * RATE)) / RATE) * 32767).astype(np.int16)
    return [rtc.AudioFrame(pcm[i : i + chunk].tobytes(), RATE, 1, chunk) for i in range(0, pcm.size, chunk)]


def test_an_agent_talks_through_the_self_hosted_avatar_in_a_livekit_room() -> None:
    async def scenario() -> None:
        worker = AvatarWorker(FastRuntime(), Avatars())
        runner = web.AppRunner(worker.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        room_name = f"ditto-{secrets.token_hex(3)}"
        token = (
            api.AccessToken(KEY, SECRET).with_identity("agent").with_kind("agent")
            .with_grants(api.VideoGrants(room_join=True, room=room_name)).to_jwt()
        )
        room = rtc.Room()
        frames_seen = asyncio.Event()

        @room.on("track_subscribed")
        def on_track(track, publication, participant) -> None:
            if track.kind == rtc.TrackKind.KIND_VIDEO and participant.identity == "ditto-avatar":
                async def read() -> None:
                    count = 0
                    async for event in rtc.VideoStream(track):
                        assert (event.frame.width, event.frame.height) == (SIZE, SIZE)
                        count += 1
                        if count >= 10:
                            frames_seen.set()
                            return
                asyncio.ensure_future(read())

        await room.connect(URL, token)
        agent = AgentSession()
        avatar = DittoAvatarSession(f"http://127.0.0.1:{port}", livekit_url=URL, api_key=KEY, api_secret=SECRET)
        try:
            await avatar.start(agent, room)
            await avatar.wait_for_join(timeout=20)
            await asyncio.wait_for(frames_seen.wait(), 20)
            audio = agent.output.audio
            for frame in speech(0.4):
                await audio.capture_frame(frame)
            audio.flush()
            done = await asyncio.wait_for(audio.wait_for_playout(), 10)
            assert not done.interrupted and done.playback_position == pytest.approx(0.4, abs=0.1)
            for _ in range(3):
                for frame in speech(1.0):
                    await audio.capture_frame(frame)
                audio.clear_buffer()
                audio.flush()
                done = await asyncio.wait_for(audio.wait_for_playout(), 10)
                assert done.interrupted, "each interrupted segment is answered, several in a row"
        finally:
            await avatar.aclose()
            await room.disconnect()
            await runner.cleanup()
        assert worker.rooms == {}

    asyncio.run(scenario())

"""The service's engine core and an output worker on threads of this process, the test as their front end, for the
tests of LiveKit rooms as a session's output.

The core runs the synthetic runtime (frames on a live clock, no model; one speech frame per push of at most 40 ms)
and the worker runs as in production, over their real sockets and shared memory. Only the room's connection is left
out (no LiveKit server installs here), one of two ways:

- ``agent="queue"``: the room output takes the agent's audio from ``AgentAudio`` (livekit-agents' real
  ``QueueAudioOutput``, both an agent's audio output and an avatar's receiver): quick, no byte streams.
- ``agent="room"``: the worker enters a ``loopback_room`` room whose other side is the agent's real
  ``DittoAudioOutput`` (what ``DittoAvatarSession`` gives the agent): byte streams read by the real
  ``DataStreamAudioReceiver``, every RPC both ways (clear, playback started and finished, pause, resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from livekit import rtc

from integrations.livekit_avatar import DittoAudioOutput
from serving.client import CoreClient
from serving.core import EngineCore
from serving.ipc import send_nowait, socket
from serving.protocol import CoreConfig, Hello, OpenSession, RoomJoined, SessionOutputs, Shutdown, WorkerConfig, decode
from serving.rooms import RoomOutput
from serving.worker import Worker
from tests.integrations.agent_audio import TTS_RATE, AgentAudio
from tests.integrations.loopback_room import LoopbackRoom, room_pair

RUNTIME = "tests.streaming.synthetic_runtime:build"
CHUNK = TTS_RATE // 25
"""40 ms: the synthetic session makes one speech frame of each push."""


@dataclass
class Agent:
    """The agent's side of one session's room: its audio output, and (``agent="room"``) both ends of the room."""

    audio: Any
    room: LoopbackRoom | None = None
    avatar_room: LoopbackRoom | None = None
    events: list[tuple[str, float, bool]] = field(default_factory=list)
    """Every playback notification the agent's audio output got: ("started" | "finished", position, interrupted)."""

    def finished(self) -> list[tuple[str, float, bool]]:
        return [e for e in self.events if e[0] == "finished"]


@dataclass
class Harness:
    """The core and a worker on threads of this process, this test as their front end."""

    worker: Worker
    core: CoreClient
    inbox: zmq.asyncio.Socket
    events: zmq.asyncio.Socket
    agents: dict[str, Agent] = field(default_factory=dict)
    left: dict[str, Callable[[str], None]] = field(default_factory=dict)
    seen: list[Any] = field(default_factory=list)

    async def on_rooms(self, coroutine: Awaitable[Any]) -> Any:
        """Run ``coroutine`` on the worker's rooms loop, where the agent's audio output lives."""
        return await asyncio.wrap_future(self.worker.rooms.run(coroutine))

    async def event(self, kind: type, seconds: float = 10.0) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await self.events.poll(100):
                message = decode(await self.events.recv())
                self.seen.append(message)
                if isinstance(message, kind):
                    return message
        raise AssertionError(f"no {kind.__name__} within {seconds} s")

    async def open(self, latency: str = "faithful") -> tuple[str, Agent, RoomOutput]:
        """A session whose output is a room: the agent's side and the room output."""
        session_id = secrets.token_hex(4)
        send_nowait(self.inbox, SessionOutputs(session_id, (), None, False, livekit=(f"local://{session_id}", "a.b.c")))
        opening = OpenSession(session_id, "anchor", None, latency, 0, None, self.worker.config.address)
        await self.core.request(opening)
        joined = await self.event(RoomJoined)
        assert joined.id == session_id and joined.error is None, joined
        return session_id, self.agents[session_id], self.worker.streams[session_id].room


def _recording(audio: Any, agent: Agent) -> None:
    audio.on("playback_started", lambda _: agent.events.append(("started", 0.0, False)))
    audio.on("playback_finished", lambda e: agent.events.append(("finished", e.playback_position, e.interrupted)))


@contextlib.asynccontextmanager
async def harness(folder: Path, agent: str = "queue") -> AsyncIterator[Harness]:
    """The core and a worker whose rooms are ``agent``'s kind (see the module's docstring)."""
    core_address, events_address = f"ipc://{folder}/core", f"ipc://{folder}/events"
    context = zmq.asyncio.Context()
    events = socket(context, zmq.PULL, events_address, bind=True)
    core = EngineCore(CoreConfig(core_address, events_address, runtime=RUNTIME, avatars={"anchor": "anchor"}))
    threads = [threading.Thread(target=core.serve, args=(core_address, events_address), daemon=True)]
    worker = Worker(WorkerConfig(0, f"ipc://{folder}/worker", events_address, core=core_address))
    agents: dict[str, Agent] = {}
    left: dict[str, Callable[[str], None]] = {}

    async def local_join(output: RoomOutput, url: str, token: str, on_left) -> tuple[str, str]:
        session_id = url.removeprefix("local://")
        left[session_id] = on_left
        if agent == "queue":
            audio = AgentAudio(wait_playback_start=True)
            agents[session_id] = Agent(audio)
            await output.attach(audio)
            return "local", "ditto-avatar"
        agent_room, avatar_room = room_pair(f"room-{session_id}")
        await output.enter(avatar_room)
        audio = DittoAudioOutput(
            agent_room,
            destination_identity=avatar_room.local_participant.identity,
            wait_remote_track=rtc.TrackKind.KIND_VIDEO,
            wait_playback_start=True,
        )
        agents[session_id] = Agent(audio, agent_room, avatar_room)
        _recording(audio, agents[session_id])
        return avatar_room.name, avatar_room.local_participant.identity

    worker.join = local_join
    threads.append(threading.Thread(target=worker.run, daemon=True))
    for thread in threads:
        thread.start()
    client = CoreClient(context, core_address)
    inbox = socket(context, zmq.PUSH, worker.config.address, bind=False)
    try:
        await client.request(Hello(), timeout=30)
        yield Harness(worker, client, inbox, events, agents, left)
    finally:
        send_nowait(inbox, Shutdown())
        with contextlib.suppress(Exception):
            await client.request(Shutdown(), timeout=5)
        for thread in threads:
            await asyncio.to_thread(thread.join, 10)
        client.close()
        for sock in (inbox, events):
            sock.close()
        context.term()


def speech(seconds: float) -> list[rtc.AudioFrame]:
    """A 220 Hz tone at the TTS's rate in 40 ms frames (``seconds`` rounded to whole frames)."""
    t = np.arange(max(1, round(seconds * 25)) * CHUNK) / TTS_RATE
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    return [rtc.AudioFrame(pcm[i : i + CHUNK].tobytes(), TTS_RATE, 1, CHUNK) for i in range(0, pcm.size, CHUNK)]


async def say(audio: Any, seconds: float, flush: bool = True) -> None:
    """The agent speaks ``seconds`` of audio into its audio output (faster than real time, as a TTS does)."""
    for frame in speech(seconds):
        await audio.capture_frame(frame)
    if flush:
        audio.flush()


async def call(action: Callable[[], Any]) -> None:
    """``action()`` on the loop this coroutine runs on."""
    action()


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)

"""LiveKit's avatar protocol over byte streams and RPCs: the agent's real ``DittoAudioOutput`` (what
``DittoAvatarSession`` gives an agent) and the service's room output, whose receiver is livekit-agents' real
``DataStreamAudioReceiver``, in one room with no server between them (``loopback_room``; the service's core and worker
as in ``room_service``).

The receiver's end rules, as livekit-agents 1.8 and 2.0.0b1 have them (``DataStreamAudioReceiver._iter_reader``): a
segment's byte stream ends at its trailer, or when a newer stream arrives while it is open (the trailer was lost), or
when a clear discards it, or after ``STREAM_IDLE_TIMEOUT`` (10 s) without a chunk. Each way, the agent hears exactly
one ``playback_finished`` for the segment, and the avatar lets go of the stream.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT

pytest.importorskip("livekit.agents", reason=INTEGRATIONS_HINT)

from livekit.agents.voice.avatar import _datastream_io

from integrations.livekit_compat import RPC_CLEAR_BUFFER, RPC_PLAYBACK_FINISHED, RPC_PLAYBACK_STARTED
from tests.integrations.room_service import Agent, call, harness, say, until


def sent(agent: Agent) -> list[str]:
    """What the agent's side and the avatar's side sent ("WHO METHOD" of an RPC, "WHO stream TOPIC"), in order."""
    return [f"{who} {thing}" for who, thing in agent.room.sent]


async def playout(agent: Agent, seconds: float = 5.0):
    return await asyncio.wait_for(agent.audio.wait_for_playout(), seconds)


def test_a_segment_over_a_byte_stream_is_reported_started_then_finished_and_a_clear_is_answered_once(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, agent="room") as h:
            _, agent, room = await h.open()
            await h.on_rooms(say(agent.audio, 0.4))
            done = await h.on_rooms(playout(agent))
            assert not done.interrupted and done.playback_position == pytest.approx(0.4, abs=0.041), done
            assert [e[0] for e in agent.events] == ["started", "finished"]
            assert sent(agent) == [
                "agent stream lk.audio_stream",
                f"ditto-avatar {RPC_PLAYBACK_STARTED}",
                f"ditto-avatar {RPC_PLAYBACK_FINISHED}",
            ]

            await h.on_rooms(say(agent.audio, 3.0))
            await until(lambda: len(agent.events) == 3)  # playing
            cleared, mark = time.monotonic(), len(agent.room.sent)

            async def interrupted_then_reply() -> None:
                agent.audio.clear_buffer()
                agent.audio.clear_buffer()  # the agent clears twice on an interruption
                await say(agent.audio, 0.4)  # and replies at once

            await h.on_rooms(interrupted_then_reply())
            await until(lambda: len(agent.finished()) == 2, 2)
            assert time.monotonic() - cleared < 0.5, "answered at once, well within the agent's 2 s"
            _, position, interrupted = agent.finished()[1]
            assert interrupted and 0 < position < 1.5
            done = await h.on_rooms(playout(agent))
            assert not done.interrupted and done.playback_position == pytest.approx(0.4, abs=0.041), "the reply, whole"
            assert sent(agent)[mark:] == [
                f"agent {RPC_CLEAR_BUFFER}",
                f"ditto-avatar {RPC_PLAYBACK_FINISHED}",
                "agent stream lk.audio_stream",
                f"ditto-avatar {RPC_PLAYBACK_STARTED}",
                f"ditto-avatar {RPC_PLAYBACK_FINISHED}",
            ], "one clear while one is unanswered, and the reply's stream after its answer"

            mark = len(agent.room.sent)
            await h.on_rooms(call(agent.audio.clear_buffer))
            await asyncio.sleep(0.1)
            assert sent(agent)[mark:] == [], "no clear with nothing playing"
            assert len(agent.finished()) == 3
            assert all(reader.closed for reader in agent.avatar_room.readers)

    asyncio.run(scenario())


def test_a_newer_stream_ends_one_whose_trailer_was_lost_and_an_idle_one_ends_after_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_datastream_io, "STREAM_IDLE_TIMEOUT", 0.6)  # 10 s in livekit-agents

    async def scenario() -> None:
        async with harness(tmp_path, agent="room") as h:
            _, agent, _ = await h.open()
            agent.room.lose_trailers = 1
            await h.on_rooms(say(agent.audio, 0.4))
            await asyncio.sleep(0.3)
            await h.on_rooms(say(agent.audio, 0.2))
            await h.on_rooms(playout(agent))
            first, second = agent.finished()
            assert not first[2] and first[1] == pytest.approx(0.4, abs=0.041), "ended by the newer stream, whole"
            assert not second[2] and second[1] == pytest.approx(0.2, abs=0.041)
            assert agent.avatar_room.readers[0].closed, "the avatar let go of the stream it stopped reading"

            agent.room.lose_trailers = 1
            sent = time.monotonic()
            await h.on_rooms(say(agent.audio, 0.4))
            done = await h.on_rooms(playout(agent))
            waited = time.monotonic() - sent
            assert not done.interrupted and done.playback_position == pytest.approx(0.4, abs=0.041), done
            assert 0.6 <= waited < 2.0, f"ended by the idle timeout: {waited:.2f} s"
            assert len(agent.finished()) == 3 and all(reader.closed for reader in agent.avatar_room.readers)

    asyncio.run(scenario())


def test_the_agent_pauses_and_resumes_the_avatar_over_rpc_and_the_segment_is_spoken_whole(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, agent="room") as h:
            _, agent, room = await h.open()
            assert agent.audio.can_pause
            await h.on_rooms(say(agent.audio, 1.6))
            await until(lambda: agent.events)
            await asyncio.sleep(0.3)
            await h.on_rooms(call(agent.audio.pause))
            await asyncio.sleep(0.6)
            spoken = room.counters["speech_frames_sent"]
            await asyncio.sleep(0.4)
            assert room.counters["speech_frames_sent"] == spoken and not agent.finished(), "paused: idle, held"
            await h.on_rooms(call(agent.audio.resume))
            done = await h.on_rooms(playout(agent))
            assert not done.interrupted and done.playback_position == pytest.approx(1.6, abs=0.09), done
            assert room.counters["pauses"] == 1 and len(agent.finished()) == 1

    asyncio.run(scenario())


def test_two_rooms_of_one_process_with_avatars_of_one_name_each_hear_their_own_playback(tmp_path: Path) -> None:
    """The stock data-stream output keeps the avatar's RPC handlers in one table per process, by the avatar's
    identity: the second room's output took the first one's events. ``DittoAudioOutput`` registers on its room."""

    async def scenario() -> None:
        async with harness(tmp_path, agent="room") as h:
            _, first, _ = await h.open()
            _, second, _ = await h.open()
            assert first.avatar_room.local_participant.identity == second.avatar_room.local_participant.identity
            await h.on_rooms(say(first.audio, 0.2))
            await h.on_rooms(say(second.audio, 0.4))
            await h.on_rooms(playout(first))
            await h.on_rooms(playout(second))
            assert [e[1] for e in first.finished()] == [pytest.approx(0.2, abs=0.041)]
            assert [e[1] for e in second.finished()] == [pytest.approx(0.4, abs=0.041)]

    asyncio.run(scenario())

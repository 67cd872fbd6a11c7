"""The LiveKit avatar's in-process mode against the real livekit-agents classes, with no LiveKit server:
``AvatarRunner`` over ``DittoVideoGenerator`` with ``QueueAudioOutput`` as the agent's audio output and the runner's
receiver, the real ``AVSynchronizer`` on local sources; and the avatar's token. (The service's room output:
``test_livekit_service.py``.)

``RoomlessRunner`` is the real runner with one step left out, publishing its tracks, which needs a server; the
1000-segment test also swaps its paced synchronizer for an immediate sink so that it runs in seconds (pacing is
what the AVSynchronizer test checks).
"""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT

pytest.importorskip("livekit.agents", reason=INTEGRATIONS_HINT)

from livekit import api, rtc
from livekit.agents.voice.avatar import AudioSegmentEnd, AvatarRunner

from integrations.livekit_avatar import (
    DittoAvatarRunner,
    DittoAvatarSession,
    DittoVideoGenerator,
    avatar_options,
    run_in_process,
)
from streaming.sinks.livekit_avatar_io import runner_parts
from tests.integrations.agent_audio import TTS_RATE, AgentAudio
from tests.integrations.fast_session import SIZE, FastSession, portrait

CHUNK = TTS_RATE // 50  # 20 ms, as a TTS streams


class RoomlessRunner(DittoAvatarRunner):
    """The avatar's runner in a room that never connects: its tracks are not published (nothing to publish to)."""

    async def _publish_track(self) -> None:
        self._video_publication = self._audio_publication = "no server: not published"


class ImmediateSync:
    """Takes the runner's frames at once (no real-time pacing) and counts them."""

    def __init__(self) -> None:
        self.video = self.audio = 0

    async def push(self, frame, timestamp=None) -> None:
        if isinstance(frame, rtc.AudioFrame):
            self.audio += 1
        else:
            self.video += 1

    async def clear_queue(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def tts_chunk(level: float = 0.3) -> rtc.AudioFrame:
    return rtc.AudioFrame((np.full(CHUNK, level * 32767, np.int16)).tobytes(), TTS_RATE, 1, CHUNK)


async def start_runner(session, immediate: bool) -> tuple[AgentAudio, DittoVideoGenerator, AvatarRunner]:
    audio = AgentAudio()
    generator = DittoVideoGenerator(session, portrait())
    runner = RoomlessRunner(rtc.Room(), audio_recv=audio, video_gen=generator, options=avatar_options(generator))
    if immediate:
        await runner._av_sync.aclose()
        runner._av_sync = ImmediateSync()
    await runner.start()
    return audio, generator, runner


async def speak(audio: AgentAudio, chunks: int) -> None:
    for _ in range(chunks):
        await audio.capture_frame(tts_chunk())
    audio.flush()


def finished(audio: AgentAudio) -> list[tuple[str, float, bool]]:
    return [e for e in audio.events if e[0] == "finished"]


def test_a_segment_plays_through_the_real_synchronizer_then_clear_after_clear_after_clear_ends_the_next_once() -> None:
    async def scenario() -> None:
        audio, generator, runner = await start_runner(FastSession(), immediate=False)
        try:
            t0 = time.monotonic()
            await speak(audio, 10)  # 200 ms
            done = await asyncio.wait_for(audio.wait_for_playout(), 3)
            assert not done.interrupted and done.playback_position == pytest.approx(0.2, abs=0.041)
            assert time.monotonic() - t0 >= 0.08, "paced in real time (the audio source queues the last 100 ms)"
            assert [e[0] for e in audio.events] == ["started", "finished"]

            for _ in range(5):
                await audio.capture_frame(tts_chunk())
            for _ in range(3):
                audio.clear_buffer()
            audio.flush()
            done = await asyncio.wait_for(audio.wait_for_playout(), 3)
            assert done.interrupted
            assert len(finished(audio)) == 2, "three clears in a row end the segment once"

            await speak(audio, 5)
            done = await asyncio.wait_for(audio.wait_for_playout(), 3)
            assert not done.interrupted and done.playback_position == pytest.approx(0.1, abs=0.041)
            assert len(finished(audio)) == 3
            assert runner.av_sync.actual_fps == pytest.approx(25, abs=3)
        finally:
            await runner.aclose()

    asyncio.run(scenario())


def test_a_thousand_segments_with_random_interruptions_each_get_exactly_one_playback_finished() -> None:
    async def scenario() -> None:
        rng = random.Random(23)
        session = FastSession()
        audio, generator, runner = await start_runner(session, immediate=True)
        expected: list[str] = []  # per segment: "natural", "interrupted" or "either" (cleared after its flush)
        started = time.monotonic()
        try:
            for k in range(1000):
                kind = rng.choice(["natural"] * 6 + ["mid", "after_flush", "triple", "before_audio"])
                chunks = rng.randint(1, 8)
                if kind == "before_audio":
                    audio.clear_buffer()  # nothing playing: no event may come of it
                    kind, cut = "natural", None
                else:
                    cut = rng.randint(1, chunks) if kind in ("mid", "triple") else None
                for i in range(chunks):
                    if cut is not None and i == cut:
                        break
                    await audio.capture_frame(tts_chunk())
                    if rng.random() < 0.2:
                        await asyncio.sleep(0)
                if cut is not None:
                    for _ in range(3 if kind == "triple" else 1):
                        audio.clear_buffer()
                audio.flush()
                if kind == "after_flush":
                    await asyncio.sleep(rng.random() * 0.002)
                    audio.clear_buffer()
                expected.append({"natural": "natural", "after_flush": "either"}.get(kind, "interrupted"))
                try:
                    await asyncio.wait_for(audio.wait_for_playout(), 2.0)
                except TimeoutError:
                    pytest.fail(
                        f"segment {k} ({kind}) got no playback_finished within 2 s (the agent's clear_buffer_timeout)"
                    )
                assert len(finished(audio)) == k + 1, f"segment {k} ({kind}): {len(finished(audio))} playback_finished"
            await asyncio.sleep(0.05)
        finally:
            await runner.aclose()
        elapsed = time.monotonic() - started
        events = finished(audio)
        assert len(events) == 1000, "exactly one playback_finished per segment, none extra afterwards"
        for k, (want, (_, position, interrupted)) in enumerate(zip(expected, events)):
            if want != "either":
                assert interrupted == (want == "interrupted"), (
                    f"segment {k}: expected {want}, got interrupted={interrupted}"
                )
            if want == "natural":
                assert position > 0
        assert generator.clears >= expected.count("interrupted")
        assert session.interrupts == generator.clears
        print(
            f"1000 segments in {elapsed:.1f} s, {expected.count('interrupted')} interrupted, {runner._av_sync.video} "
            "pictures"
        )

    asyncio.run(scenario())


def test_segment_ends_follow_the_last_speech_frame_and_a_cleared_segment_never_ends_the_next() -> None:
    async def scenario() -> None:
        session = FastSession(frames_per_call=1)
        generator = DittoVideoGenerator(session, portrait())
        frames = generator.__aiter__()
        first = await frames.__anext__()
        assert isinstance(first, rtc.VideoFrame) and (first.width, first.height) == (SIZE, SIZE)

        async def until_end(limit: int = 50) -> tuple[int, int]:
            speech_audio = pictures = 0
            for _ in range(limit):
                item = await frames.__anext__()
                if isinstance(item, AudioSegmentEnd):
                    return pictures, speech_audio
                if isinstance(item, rtc.AudioFrame):
                    assert (item.sample_rate, item.samples_per_channel) == (48_000, 1920)
                    speech_audio += 1
                else:
                    pictures += 1
            raise AssertionError("no segment end")

        for _ in range(5):
            await generator.push_audio(tts_chunk())  # 100 ms: 3 speech frames (40 ms each)
        await generator.push_audio(AudioSegmentEnd())
        pictures, speech = await until_end()
        assert speech == 3 and pictures == 4, "the end comes after the last speech frame and the first idle one"

        await generator.push_audio(tts_chunk())
        generator.clear_buffer()
        await generator.push_audio(AudioSegmentEnd())  # the cleared segment's trailer, after the clear
        await generator.push_audio(tts_chunk())
        await generator.push_audio(AudioSegmentEnd())
        pictures, speech = await until_end()
        assert speech == 1, "one segment end, for the new segment only, after its own speech"
        assert session.interrupts == 1

    asyncio.run(scenario())


def test_the_avatar_token_joins_only_its_room_and_publishes_on_behalf_of_the_agent() -> None:
    avatar = DittoAvatarSession(
        "http://127.0.0.1:1", livekit_url="ws://127.0.0.1:7880", api_key="devkey", api_secret="s" * 32
    )
    claims = api.TokenVerifier("devkey", "s" * 32).verify(avatar.token("room-a", "agent-1"))
    assert claims.identity == "ditto-avatar" and claims.kind == "agent"
    assert claims.video.room_join and claims.video.room == "room-a"
    assert claims.attributes == {"lk.publish_on_behalf": "agent-1"}


@pytest.mark.slow
def test_in_process_mode_pushes_into_a_real_runtime_session_and_a_clear_interrupts_it_with_one_event(
    cpu_runtime, registered_avatar
) -> None:
    """The in-process mode over the real runtime: the agent's 24 kHz TTS reaches the session (resampled there), a clear
    before any of it was shown interrupts the session and answers the agent once. (The room never connects: the
    pictures wait to be published, the audio path and the events do not.)"""

    async def scenario() -> None:
        audio, runner = await run_in_process(rtc.Room(), cpu_runtime, registered_avatar)
        generator = runner_parts(runner)[1]
        session = generator.session
        finished_events = []
        audio.on("playback_finished", finished_events.append)
        try:
            first = await generator.__aiter__().__anext__()
            assert (first.width, first.height) == (320, 320), "the portrait, before the runtime's first frame"
            for _ in range(25):
                await audio.capture_frame(tts_chunk())  # 0.5 s
            audio.flush()
            await asyncio.sleep(0.2)
            assert session.stats()["lead_seconds"] >= 0.45, "the speech is in the session"
            for _ in range(3):
                audio.clear_buffer()
            done = await asyncio.wait_for(audio.wait_for_playout(), 2)
            assert done.interrupted and len(finished_events) == 1
            assert session.stats()["interrupts"] == 3, "each clear interrupts the session; the agent hears of it once"
        finally:
            await runner.aclose()
        assert session.finished

    asyncio.run(scenario())

"""A room's tracks fed in step (``streaming.sinks.room_tracks``), on LiveKit's real audio and video sources: a
picture leaves when its sound starts to, also after the frames' producer stalls, and the latency a stall adds is
given back at the next silence; every picture goes with exactly one slot of sound.

When a frame's sound starts to leave is read from the audio source as LiveKit accounts for it: at the capture call,
after the sound queued before it (``AudioSource.queued_duration``).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT

pytest.importorskip("livekit.agents", reason=INTEGRATIONS_HINT)

from livekit import rtc

from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from streaming.sinks.room_tracks import AUDIO_QUEUE_MS, RoomTracks

SIZE = 16
STALL_AT, SPEECH_UNTIL, FRAMES = 10, 35, 60
STALL_S = 0.2


class RecordingAudio(rtc.AudioSource):
    """The real audio source, noting when each frame's sound starts to leave and how many samples it has."""

    def __init__(self) -> None:
        super().__init__(AUDIO_RATE, 1, queue_size_ms=AUDIO_QUEUE_MS)
        self.starts: list[float] = []
        self.queued: list[float] = []
        self.sizes: list[int] = []
        self.speech = 0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        self.queued.append(self.queued_duration)
        self.starts.append(time.monotonic() + self.queued[-1])
        self.sizes.append(frame.samples_per_channel)
        self.speech += bool(np.frombuffer(frame.data, np.int16).any())
        await super().capture_frame(frame)


class RecordingVideo(rtc.VideoSource):
    """The real video source, noting when each picture is captured."""

    def __init__(self) -> None:
        super().__init__(SIZE, SIZE)
        self.shown: list[float] = []

    def capture_frame(self, frame: rtc.VideoFrame, **options) -> None:
        self.shown.append(time.monotonic())
        super().capture_frame(frame, **options)


def test_pictures_leave_with_their_sound_after_a_stall_and_the_added_latency_is_given_back_at_silence() -> None:
    async def scenario() -> tuple[RecordingAudio, RecordingVideo, RoomTracks, dict[str, float]]:
        audio, video = RecordingAudio(), RecordingVideo()
        tracks = RoomTracks(audio, video)
        picture = rtc.VideoFrame(SIZE, SIZE, rtc.VideoBufferType.I420, bytes(SIZE * SIZE * 3 // 2))
        tone = np.full(AUDIO_SAMPLES_PER_FRAME, 0.1, np.float32)
        started = time.monotonic()
        for index in range(FRAMES):
            if index == STALL_AT:
                await asyncio.sleep(STALL_S)  # the producer stalls; the frames due meanwhile then come at once
            await asyncio.sleep(max(0.0, started + index / 25 - time.monotonic()))
            sound = (
                tone
                if index < SPEECH_UNTIL
                else np.zeros(0 if index == FRAMES - 1 else AUDIO_SAMPLES_PER_FRAME, np.float32)
            )
            await tracks.push(picture, sound)
        await asyncio.sleep(0.2)
        stats = tracks.stats()
        await tracks.aclose()
        return audio, video, tracks, stats

    audio, video, tracks, stats = asyncio.run(scenario())
    assert len(video.shown) == len(audio.starts) == FRAMES - tracks.given_back
    offsets = np.abs(np.array(video.shown) - np.array(audio.starts)) * 1000
    assert offsets.max() < 40, f"a picture left {offsets.max():.1f} ms from its sound"
    assert max(audio.queued) > 0.05, "the stall's frames filled the audio queue (the case being tested)"
    assert audio.speech == SPEECH_UNTIL and tracks.given_back >= 1, "silent frames given back, no speech"
    assert stats["audio_queued_ms"] <= 45 and stats["av_offset_ms_max"] < 40, stats
    assert set(audio.sizes) == {AUDIO_SAMPLES_PER_FRAME}, "one slot of sound with every picture, never an empty frame"

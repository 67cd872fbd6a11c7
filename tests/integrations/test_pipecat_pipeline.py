"""The pipecat video service in a real pipecat pipeline, fast: over the synthetic session (hop batches, speech for as
long as the audio pushed), without a transport. Pictures flow at 25 fps before any TTS; speech frames carry their
audio and idle ones none; a TTS pushing faster than the session's lead is held back (bounded memory); an interruption
mid-utterance ends its speech frames within one slot and the pictures go on."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from tests.integrations.conftest import INTEGRATIONS_HINT

pytest.importorskip("pipecat", reason=INTEGRATIONS_HINT)

from pipecat.frames.frames import (
    Frame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from integrations.pipecat_video import DittoVideoService
from tests.integrations.fast_session import SIZE, FastSession, portrait

TTS_RATE = 16_000


class FastRuntime:
    def __init__(self, max_lead: float) -> None:
        self.max_lead = max_lead
        self.sessions: list[FastSession] = []

    def open_session(self, avatar, **options) -> FastSession:
        self.sessions.append(FastSession(max_lead=self.max_lead))
        return self.sessions[-1]


class Avatar:
    frames = torch.from_numpy(portrait())[None]


class Recorder(FrameProcessor):
    """What reaches the transport: (monotonic time, frame) for pictures and audio, and the TTS control frames."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[float, OutputImageRawFrame]] = []
        self.audio: list[tuple[float, OutputAudioRawFrame]] = []
        self.stopped = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputImageRawFrame):
            self.images.append((time.monotonic(), frame))
        elif isinstance(frame, OutputAudioRawFrame):
            self.audio.append((time.monotonic(), frame))
        elif isinstance(frame, TTSStoppedFrame):
            self.stopped += 1
        await self.push_frame(frame, direction)


def tts(seconds: float) -> list[Frame]:
    step = TTS_RATE // 50
    pcm = np.full(int(seconds * TTS_RATE), 8000, np.int16)
    return [
        TTSStartedFrame(),
        *(TTSAudioRawFrame(pcm[i : i + step].tobytes(), TTS_RATE, 1) for i in range(0, pcm.size, step)),
        TTSStoppedFrame(),
    ]


def is_speech(image: OutputImageRawFrame) -> bool:
    """The synthetic session paints speech frames green (see fast_session)."""
    return np.frombuffer(image.image, np.uint8).reshape(SIZE, SIZE, 3)[0, 0, 1] == 255


def test_pictures_flow_before_tts_speech_has_its_audio_fast_tts_is_held_back_and_interruptions_end_speech() -> None:
    async def scenario() -> None:
        runtime = FastRuntime(max_lead=1.0)
        service, recorder = DittoVideoService(runtime, Avatar()), Recorder()
        task = PipelineTask(Pipeline([service, recorder]), params=PipelineParams())
        run = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        try:
            await asyncio.sleep(0.4)
            before = list(recorder.images)
            assert len(before) >= 7 and not recorder.audio, "idle pictures at 25 fps, no audio, before any TTS"
            assert [f.pts for _, f in before[:3]] == [0, 40_000_000, 80_000_000], "pts from the slot index"
            session = runtime.sessions[0]

            await task.queue_frames(tts(0.4))
            await asyncio.sleep(0.8)
            speech = [f for _, f in recorder.images if is_speech(f)]
            assert len(speech) == 10 and len(recorder.audio) == 10, (
                "0.4 s of TTS: 10 speech frames, each with its audio"
            )
            assert all(a.sample_rate == 48_000 and a.num_frames == 1920 for _, a in recorder.audio)
            assert recorder.stopped == 1

            await task.queue_frames(tts(6.0))  # far faster than real time, more than the session's 1 s lead
            await asyncio.sleep(1.0)
            assert session.pending <= 1.0 + 1e-9 and service.stats.audio_seconds_in < 0.4 + 2.5, (
                "held back, not buffered"
            )
            await task.queue_frame(InterruptionFrame())
            while service.stats.interrupts == 0:
                await asyncio.sleep(0.005)
            interrupted = service.stats.last_interrupt_at
            await asyncio.sleep(0.6)
            late = [t for t, f in recorder.images if t > interrupted + 0.045 and is_speech(f)]
            assert not late, f"speech frames {[round(t - interrupted, 3) for t in late]} s after the interruption"
            assert sum(t > interrupted for t, _ in recorder.images) >= 12, "pictures go on"
            assert service.stats.audio_seconds_in < 0.4 + 3.5, "the rest of the 6 s utterance was dropped, not queued"
            slots = [t for t, _ in recorder.images]
            assert len(slots) / (slots[-1] - slots[0]) == pytest.approx(25, abs=1.5)
        finally:
            await task.cancel()
            await asyncio.gather(run, return_exceptions=True)
        assert runtime.sessions[0].closed

    asyncio.run(scenario())

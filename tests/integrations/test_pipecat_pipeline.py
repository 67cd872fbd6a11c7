"""The pipecat video service in a real pipecat pipeline, fast: over the synthetic session (hop batches, speech for as
long as the audio pushed), without a transport. Pictures flow at 25 fps before any TTS; speech frames carry their
audio and idle ones none; a TTS pushing faster than the session's lead is held back (bounded memory); an interruption
mid-utterance ends its speech frames from the next slot and the pictures go on.

Timing is read off the service's own slot clock (each slot's number and when it was emitted), bounded by the event
loop's measured scheduling delay, never by counting pictures over a stretch of wall time: a loaded machine's stalls
delay and skip slots without the clock drifting."""

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


class LoopDelay:
    """The event loop's scheduling delay while the test runs: how late a 5 ms sleep wakes, at most (a loaded machine's
    stalls, which delay the service's slots just as much). A slot is emitted that late after its due time at most,
    give or take the probe's own 5 ms and the slot's work: a clock that drifted would be later and later."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task = asyncio.ensure_future(self._probe())

    async def _probe(self) -> None:
        while True:
            asked = time.monotonic() + 0.005
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.monotonic() - asked)

    def stop(self) -> None:
        self._task.cancel()


async def until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_pictures_flow_before_tts_speech_has_its_audio_fast_tts_is_held_back_and_interruptions_end_speech() -> None:
    async def scenario() -> None:
        runtime = FastRuntime(max_lead=1.0)
        service, recorder = DittoVideoService(runtime, Avatar()), Recorder()
        task = PipelineTask(Pipeline([service, recorder]), params=PipelineParams())
        delay = LoopDelay()
        run = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        try:
            await until(lambda: len(recorder.images) >= 7)
            assert not recorder.audio, "idle pictures, no audio, before any TTS"
            pts = [f.pts for _, f in recorder.images]
            assert pts[0] == 0 and all(b > a and b % 40_000_000 == 0 for a, b in zip(pts, pts[1:])), (
                "pts from the slot index"
            )
            session = runtime.sessions[0]

            await task.queue_frames(tts(0.4))
            await until(lambda: recorder.stopped == 1)
            speech = [f for _, f in recorder.images if is_speech(f)]
            assert len(speech) == 10 and len(recorder.audio) == 10, (
                "0.4 s of TTS: 10 speech frames, each with its audio, before the TTSStoppedFrame passes"
            )
            assert all(a.sample_rate == 48_000 and a.num_frames == 1920 for _, a in recorder.audio)

            queued, before = time.monotonic(), service.stats.audio_seconds_in
            await task.queue_frames(tts(6.0))  # far faster than real time, more than the session's 1 s lead
            await asyncio.sleep(1.0)
            taken, played = service.stats.audio_seconds_in - before, time.monotonic() - queued
            assert session.pending <= 1.0 + 1e-9 and taken <= 1.0 + played + 0.2, (
                "held back, not buffered: the lead, and what was played meanwhile (a hop taken at once)"
            )
            await task.queue_frame(InterruptionFrame())
            await until(lambda: service.stats.interrupts == 1)
            interrupted = service.stats.last_interrupt_at
            await until(lambda: sum(r.emitted_at > interrupted for r in service.stats.log) >= 12)
            after = [r for r in service.stats.log if r.emitted_at > interrupted]
            assert not any(r.speech for r in after), "from the next slot on, no speech frame: the pictures go on idle"
            assert session.pending == 0, "the rest of the 6 s utterance was dropped, not queued"
        finally:
            delay.stop()
            await task.cancel()
            await asyncio.gather(run, return_exceptions=True)
        assert runtime.sessions[0].closed
        late = [r.emitted_at - r.slot / 25 for r in service.stats.log]
        assert max(late) - min(late) <= delay.worst + 0.01, (
            f"every slot emitted on the 25 fps wall clock: {max(late) - min(late):.3f} s apart, the loop's worst delay "
            f"{delay.worst:.3f} s"
        )

    asyncio.run(scenario())

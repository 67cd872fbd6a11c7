"""A live session's timeline: speech is shown ``depth + lead`` after it is pushed, whatever the phase of the hop grid.

One live session's pipeline is driven the way the runtime's loop drives it (its real motion stream,
HuBERT stand-in and stitching network on random weights) on a virtual clock: ticks every 10 ms,
compute taking no time (the GPU's share of the lead is 0 here). What is under test is when frames
become final, not what they show, so each LMDM window is its conditioning frame repeated (the
real LMDM takes seconds per window on two cores; tests/runtime/test_pipeline_controls.py runs it
through the same pipeline). A TTS-like pusher sends 20 ms chunks of 16 kHz PCM in real time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.audio.hubert import encode_chunks
from engine.engine import Engine
from engine.runtime.avatars import LoadedAvatar
from engine.runtime.config import RuntimeConfig
from engine.runtime.pacing import speech_depth
from engine.runtime.pipeline import SessionPipeline
from engine.session import FPS, Session

pytestmark = pytest.mark.slow
TICK = 0.01
RATE = 16_000
CHUNK = RATE // 50
SINK_RATE = 48_000
MARGIN = 0.5


class LiveLoop:
    """One live session on a virtual clock: push what is due, tick, note when each frame was ready and the silence committed ahead."""

    def __init__(self, engine: Engine, avatar: LoadedAvatar) -> None:
        self.engine = engine
        self.session = Session(0, avatar.name, True, 75, 0, RuntimeConfig(progress=False, min_lead_frames=MARGIN), lambda: None)
        self.pipeline = SessionPipeline(
            self.session, avatar, engine.backend.stitch, engine.silence_feature, engine.step_noise(0), 1103, self.session.controls,
            RuntimeConfig(progress=False, min_lead_frames=MARGIN),
        )
        self.now = 0.0
        self.ready_at: dict[int, float] = {}
        self.audio: dict[int, np.ndarray] = {}
        self.speech: dict[int, bool] = {}
        self.committed_ahead: list[float] = []

    def tick(self) -> None:
        p = self.pipeline
        p.intake(self.now)
        chunks, keep = p.motion.take_chunks(16)
        p.motion.add_features(encode_chunks(self.engine.hubert, chunks)[:keep])
        while (request := p.window_request()) is not None:
            p.complete(request.cond_frame.expand(80, -1).clone())
        if count := p.backlog.shape[0]:
            motion, _, _, _ = p.stitch(count)
            p.deliver(motion, torch.zeros(count, 2, 2, 3, dtype=torch.uint8), None)
        p.check_deadlines(self.now)
        for frame in self.session.take_ready():
            self.ready_at[frame.index] = self.now
            self.audio[frame.index] = frame.audio
            self.speech[frame.index] = frame.speech
        if p.anchor is not None and not p.tail_is_speech:
            self.committed_ahead.append(p.motion.samples_in / 640 - (self.now - p.anchor) * FPS)

    def run(self, until: float, pcm: np.ndarray | None = None, start: float = 0.0) -> None:
        """Tick until ``until``; ``pcm`` (16 kHz) is pushed in 20 ms chunks, each at its first sample's time from ``start``."""
        sent = 0
        while self.now < until - 1e-9:
            while pcm is not None and sent < pcm.size and start + sent / RATE <= self.now + 1e-9:
                self.session.push_audio(pcm[sent : sent + CHUNK], RATE)
                sent += CHUNK
            self.tick()
            self.now = round(self.now + TICK, 6)

    def shown_at(self, sample: int) -> float:
        """When the clock shows the 48 kHz output sample ``sample``."""
        return self.pipeline.anchor + sample / SINK_RATE


def utterance(seconds: float, level: float = 0.4) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (level * np.cos(2 * np.pi * 220 * t)).astype(np.float32)


@pytest.mark.parametrize("phase", [0.0, 0.07, 0.13])
def test_speech_is_shown_depth_plus_lead_after_it_is_pushed_whatever_the_phase(engine: Engine, avatar: LoadedAvatar, phase: float) -> None:
    loop = LiveLoop(engine, avatar)
    pushed = 1.0 + phase
    loop.run(pushed)
    idle_ahead = max(loop.committed_ahead)
    loop.run(pushed + 1.2, utterance(0.6), start=pushed)

    frames = sorted(loop.audio)
    audio = np.concatenate([loop.audio[i] for i in frames])
    first = int(np.flatnonzero(np.abs(audio) > 0.1)[0]) + frames[0] * SINK_RATE // FPS
    depth = speech_depth(5, 5)
    lead = loop.pipeline.lead.frames
    assert loop.shown_at(first) - pushed == pytest.approx((depth + lead) / FPS, abs=0.001), "latency is depth + lead"

    spoken = [i for i in frames if loop.speech[i]]
    assert spoken == list(range(spoken[0], spoken[0] + len(spoken))) and len(spoken) >= 0.6 * FPS, "no silence inside on-time speech"
    late = [i for i in frames if i >= 5 and loop.ready_at[i] > loop.pipeline.anchor + i / FPS]
    assert not late, "every frame is ready by the time the clock shows it"
    pushed_through = spoken[: -int(np.ceil(depth))]
    slack = min(loop.pipeline.anchor + i / FPS - loop.ready_at[i] for i in pushed_through)
    assert slack >= (MARGIN / FPS) - TICK - 1e-9, "frames made final by pushed speech are ready the margin ahead (less a tick)"
    assert idle_ahead <= depth + lead, "idle silence is never committed further ahead than speech would be placed"
    assert loop.session.counters["deadline_misses"] == 0
    assert loop.session.stats()["speech_latency_ms"] == pytest.approx((depth + lead) / FPS * 1000, abs=0.1)


def test_a_pusher_that_stalls_gets_silence_just_in_time_and_no_frame_is_late(engine: Engine, avatar: LoadedAvatar) -> None:
    loop = LiveLoop(engine, avatar)
    loop.run(1.0)
    loop.run(1.4, utterance(0.4, level=0.2), start=1.0)
    loop.run(1.55)
    loop.run(1.55 + 1.2, utterance(0.4), start=1.55)

    frames = sorted(loop.audio)
    assert frames == list(range(frames[0], frames[-1] + 1)), "the stream goes on through the stall"
    assert not [i for i in frames if i >= 5 and loop.ready_at[i] > loop.pipeline.anchor + i / FPS], "no frame late through the stall"
    audio = np.concatenate([loop.audio[i] for i in frames])
    assert np.abs(audio).max() > 0.3, "the words after the stall are all spoken"
    assert loop.session.counters["deadline_misses"] == 0

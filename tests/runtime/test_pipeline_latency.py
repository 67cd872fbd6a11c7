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
from engine.runtime.pacing import frames_due, speech_depth
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

    def __init__(self, engine: Engine, avatar: LoadedAvatar, grid: float | None = None, paced: bool = False) -> None:
        """``grid``: the origin of a batching runtime's window grid; windows then wait until due, as that runtime has them.
        ``paced``: frames are taken only once the clock shows them (as a sink does), not as soon as they are ready."""
        self.engine = engine
        self.session = Session(0, avatar.name, True, 75, 0, RuntimeConfig(progress=False, min_lead_frames=MARGIN), lambda: None)
        self.pipeline = SessionPipeline(
            self.session, avatar, engine.backend.stitch, engine.silence_feature, engine.step_noise(0), 1103, self.session.controls,
            RuntimeConfig(progress=False, min_lead_frames=MARGIN),
        )
        self.pipeline.grid = grid
        self.paced = paced
        self.next_index = 0
        self.now = 0.0
        self.pcm: np.ndarray | None = None
        self.pcm_start = 0.0
        self.sent = 0
        self.window_ticks: list[float] = []
        self.ready_at: dict[int, float] = {}
        self.audio: dict[int, np.ndarray] = {}
        self.speech: dict[int, bool] = {}
        self.committed_ahead: list[float] = []

    def say(self, pcm: np.ndarray, start: float) -> None:
        """Push ``pcm`` (16 kHz) in 20 ms chunks from ``start`` on, each at its first sample's time."""
        self.pcm, self.pcm_start, self.sent = pcm, start, 0

    def tick(self) -> None:
        while self.pcm is not None and self.sent < self.pcm.size and self.pcm_start + self.sent / RATE <= self.now + 1e-9:
            self.session.push_audio(self.pcm[self.sent : self.sent + CHUNK], RATE)
            self.sent += CHUNK
        p = self.pipeline
        p.intake(self.now)
        chunks, keep = p.motion.take_chunks(16)
        p.motion.add_features(encode_chunks(self.engine.hubert, chunks)[:keep])
        while (p.grid is None or p.window_due(self.now)) and (request := p.window_request()) is not None:
            p.complete(request.cond_frame.expand(80, -1).clone())
            self.window_ticks.append(self.now)
        if count := p.backlog.shape[0]:
            motion, _, _ = p.pose(count)
            p.deliver(motion, torch.zeros(count, 2, 2, 3, dtype=torch.uint8), None)
        p.check_deadlines(self.now)
        for frame in self._take():
            self.ready_at[frame.index] = self.now
            self.audio[frame.index] = frame.audio
            self.speech[frame.index] = frame.speech
        if p.anchor is not None and not p.tail_is_speech:
            self.committed_ahead.append(p.motion.samples_in / 640 - (self.now - p.anchor) * FPS)

    def _take(self) -> list:
        if not self.paced:
            return self.session.take_ready()
        frames = []
        while self.session.frames_queued and self.next_index <= frames_due(self.now, self.pipeline.anchor):
            frames.append(self.session.next_frame(timeout=0))
            self.next_index = frames[-1].index + 1
        return frames

    def run(self, until: float, pcm: np.ndarray | None = None, start: float = 0.0) -> None:
        """Tick until ``until``, saying ``pcm`` (see ``say``) from ``start`` on."""
        if pcm is not None:
            self.say(pcm, start)
        while self.now < until - 1e-9:
            self.tick()
            self.now = round(self.now + TICK, 6)

    def shown_at(self, sample: int) -> float:
        """When the clock shows the 48 kHz output sample ``sample``."""
        return self.pipeline.anchor + sample / SINK_RATE

    def first_spoken_at(self) -> float:
        """When the clock shows the first loud output sample."""
        frames = sorted(self.audio)
        audio = np.concatenate([self.audio[i] for i in frames])
        return self.shown_at(int(np.flatnonzero(np.abs(audio) > 0.1)[0]) + frames[0] * SINK_RATE // FPS)

    def late_frames(self) -> list[int]:
        """Frames (after the first hop) ready only after the clock showed them."""
        return [i for i in sorted(self.ready_at) if i >= 5 and self.ready_at[i] > self.pipeline.anchor + i / FPS]


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
    depth = speech_depth(5, 5)
    lead = loop.pipeline.lead.frames
    assert loop.first_spoken_at() - pushed == pytest.approx((depth + lead) / FPS, abs=0.001), "latency is depth + lead"

    spoken = [i for i in frames if loop.speech[i]]
    assert spoken == list(range(spoken[0], spoken[0] + len(spoken))) and len(spoken) >= 0.6 * FPS, "no silence inside on-time speech"
    assert not loop.late_frames(), "every frame is ready by the time the clock shows it"
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
    assert not loop.late_frames(), "no frame late through the stall"
    audio = np.concatenate([loop.audio[i] for i in frames])
    assert np.abs(audio).max() > 0.3, "the words after the stall are all spoken"
    assert loop.session.counters["deadline_misses"] == 0


def test_sessions_that_start_and_speak_out_of_phase_run_their_windows_in_the_same_ticks(engine: Engine, avatar: LoadedAvatar) -> None:
    loops = [LiveLoop(engine, avatar, grid=0.055) for _ in range(3)]
    starts = [0.0, 0.07, 0.13]
    pushed = 2.03
    loops[1].say(utterance(0.6), start=pushed)
    loops[2].say(utterance(0.6), start=pushed + 0.11)
    now = 0.0
    while now < 4.0:
        for loop, start in zip(loops, starts):
            if now >= start:
                loop.now = now
                loop.tick()
        now = round(now + TICK, 6)

    for loop, start in zip(loops, starts):
        first_due = loop.pipeline.anchor - 0.055
        assert first_due / 0.2 == pytest.approx(round(first_due / 0.2), abs=1e-6), "every clock starts on the 200 ms grid"
        assert loop.pipeline.anchor - start < 0.2 + 0.2 + 0.055, "its first frame comes at most one hop later than alone"
    steady = [{t for t in loop.window_ticks if t >= 1.0} for loop in loops]
    idle = steady[0]
    assert len(idle) >= 14
    for ticks in steady[1:]:
        late = ticks - idle
        assert len(ticks) == len(idle) and len(late) <= 1, "idle or speaking, every window of a hop runs in the same tick"
        assert all(round(t - TICK, 6) in idle for t in late), "but the one after an utterance, which waits half the margin for a late push"
    for loop in loops:
        assert not loop.late_frames(), "and every frame is ready by the time its clock shows it"
    lead = loops[1].pipeline.lead.frames
    assert loops[1].first_spoken_at() - pushed == pytest.approx((speech_depth(5, 5) + lead) / FPS, abs=0.001), "latency is unchanged"


def test_an_interrupted_session_runs_its_windows_with_the_others_again(engine: Engine, avatar: LoadedAvatar) -> None:
    loops = [LiveLoop(engine, avatar, grid=0.055, paced=True) for _ in range(2)]
    speaker = loops[1]
    speaker.say(utterance(2.0), start=1.03)
    now = 0.0
    while now < 5.0:
        if now == 1.87:  # barge-in: the rest of the utterance and the frames queued for it are dropped
            speaker.pcm = None
            speaker.session.interrupt()
        if now == 2.31:
            speaker.say(utterance(0.6), start=now)
            shown_before = max(speaker.audio)
        for loop in loops:
            loop.now = now
            loop.tick()
        now = round(now + TICK, 6)

    idle = {t for t in loops[0].window_ticks if t >= 1.0}
    after = {t for t in speaker.window_ticks if t >= 1.95}
    assert len(after) >= 14
    apart = after - idle
    assert len(apart) <= 2, f"after its first window and the one after the new utterance, it batches again: apart at {sorted(apart)}"
    taken = sorted(speaker.audio)
    assert taken == list(range(taken[0], taken[-1] + 1)), "the stream goes on through the interrupt without a gap"
    frames = [i for i in taken if i > shown_before]
    audio = np.concatenate([speaker.audio[i] for i in frames])
    first_loud = speaker.shown_at(int(np.flatnonzero(np.abs(audio) > 0.1)[0]) + frames[0] * SINK_RATE // FPS)
    lead = speaker.pipeline.lead.frames
    assert first_loud - 2.31 == pytest.approx((speech_depth(5, 5) + lead) / FPS, abs=0.001), "the new utterance keeps the latency"
    assert speaker.session.counters["deadline_misses"] == 0

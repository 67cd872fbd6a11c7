"""A live session's timeline: speech is shown ``depth + lead`` after it is pushed, whatever the phase of the hop grid.

Live sessions are driven through a runtime's own ``step`` (its scheduler, the real motion stream, HuBERT
stand-in and stitching network on random weights) on a virtual clock: ticks every 10 ms, compute taking
no time (the GPU's share of the lead is 0 here). What is under test is when frames become final, not
what they show, so the executor makes each LMDM window its conditioning frame repeated and renders
black 2x2 images (the real LMDM takes seconds per window on two cores; tests/engine/runtime/test_pipeline_controls.py
runs it through the same pipeline). A TTS-like pusher sends 20 ms chunks of 16 kHz PCM in real time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from avatars.cache import Avatar
from engine.engine import Engine
from engine.runtime.config import RuntimeConfig
from engine.runtime.executor import Executor, PosedJob, Rendered
from engine.runtime.pacing import frames_due, speech_depth
from engine.runtime.runtime import Runtime
from engine.runtime.scheduler import WindowJob
from engine.runtime.session import Session
from engine.timebase import FPS

pytestmark = pytest.mark.slow
TICK = 0.01
RATE = 16_000
CHUNK = RATE // 50
SINK_RATE = 48_000
MARGIN = 0.5


class InstantExecutor(Executor):
    """Each window is its conditioning frame repeated, each render a black 2x2 image: only when frames become final
    matters."""

    def sample(self, batch: list[WindowJob]) -> torch.Tensor:
        return torch.stack([job.request.cond_frame.expand(80, -1).clone() for job in batch])

    def render(self, batch: list[PosedJob], x_s: torch.Tensor, x_d: torch.Tensor, costs: dict[int, float]) -> Rendered:
        return Rendered([torch.zeros(job.rows.shape[0], 2, 2, 3, dtype=torch.uint8) for job in batch], None)


class VirtualRuntime:
    """A runtime without its loop thread, stepped every ``TICK`` on a virtual clock that starts at 0 (its window grid's
    origin).

    ``batched``: sessions share calls and a live session's windows wait until due on the grid, as on CUDA.
    """

    def __init__(self, engine: Engine, avatar: Avatar, batched: bool = False) -> None:
        self.now = 0.0
        config = RuntimeConfig(progress=False, min_lead_frames=MARGIN, batch_sessions=batched)
        self.runtime = Runtime(engine, config, start=False, clock=lambda: self.now)
        self.runtime.executor = InstantExecutor(engine, self.runtime.sampler, config, self.runtime.counters)
        self.avatar = avatar
        self.loops: list[LiveLoop] = []

    def open(self, paced: bool = False, latency: str = "faithful") -> LiveLoop:
        """A new live session, ticked from now on."""
        loop = LiveLoop(self, self.runtime.open_session(self.avatar, live=True, seed=0, latency=latency), paced)
        self.loops.append(loop)
        return loop

    def tick(self) -> None:
        """Push what is due, run one step at ``now``, note what each session got; then advance the clock."""
        for loop in self.loops:
            loop.push_due()
        self.runtime.step()
        for loop in self.loops:
            loop.observe()
        self.now = round(self.now + TICK, 6)

    def run(self, until: float) -> None:
        while self.now < until - 1e-9:
            self.tick()


class LiveLoop:
    """One live session of a ``VirtualRuntime``: push what is due, note when each frame was ready and the audio
    committed ahead."""

    def __init__(self, host: VirtualRuntime, session: Session, paced: bool) -> None:
        """``paced``: frames are taken only once the clock shows them (as a sink does), not as soon as they are
        ready."""
        self.host = host
        self.session = session
        self.paced = paced
        self.next_index = 0
        self.pcm: np.ndarray | None = None
        self.pcm_start = 0.0
        self.sent = 0
        self.windows = 0
        self.window_ticks: list[float] = []
        self.ready_at: dict[int, float] = {}
        self.audio: dict[int, np.ndarray] = {}
        self.speech: dict[int, bool] = {}
        self.segments: dict[int, int] = {}
        self.committed_ahead: list[float] = []

    @property
    def anchor(self) -> float | None:
        return self.session.clock_anchor

    @property
    def lead_frames(self) -> float:
        return self.host.runtime.lead(len(self.host.loops)).frames

    def say(self, pcm: np.ndarray, start: float) -> None:
        """Push ``pcm`` (16 kHz) in 20 ms chunks from ``start`` on, each at its first sample's time."""
        self.pcm, self.pcm_start, self.sent = pcm, start, 0

    def push_due(self) -> None:
        now = self.host.now
        while self.pcm is not None and self.sent < self.pcm.size and self.pcm_start + self.sent / RATE <= now + 1e-9:
            self.session.push_audio(self.pcm[self.sent : self.sent + CHUNK], RATE)
            self.sent += CHUNK

    def observe(self) -> None:
        now = self.host.now
        windows = self.session.counters["windows"]
        self.window_ticks.extend([now] * (windows - self.windows))
        self.windows = windows
        for frame in self._take():
            self.ready_at[frame.index] = now
            self.audio[frame.index] = frame.audio
            self.speech[frame.index] = frame.speech
            self.segments[frame.index] = frame.segment
        if self.anchor is not None and self.sent == 0:
            self.committed_ahead.append(self.session.committed_samples / 640 - (now - self.anchor) * FPS)

    def _take(self) -> list:
        if not self.paced:
            return self.session.take_ready()
        frames = []
        while self.session.frames_queued and self.next_index <= frames_due(self.host.now, self.anchor):
            frames.append(self.session.next_frame(timeout=0))
            self.next_index = frames[-1].index + 1
        return frames

    def run(self, until: float, pcm: np.ndarray | None = None, start: float = 0.0) -> None:
        """Tick until ``until``, saying ``pcm`` (see ``say``) from ``start`` on."""
        if pcm is not None:
            self.say(pcm, start)
        self.host.run(until)

    def shown_at(self, sample: int) -> float:
        """When the clock shows the 48 kHz output sample ``sample``."""
        return self.anchor + sample / SINK_RATE

    def first_spoken_at(self) -> float:
        """When the clock shows the first loud output sample."""
        frames = sorted(self.audio)
        audio = np.concatenate([self.audio[i] for i in frames])
        return self.shown_at(int(np.flatnonzero(np.abs(audio) > 0.1)[0]) + frames[0] * SINK_RATE // FPS)

    def late_frames(self) -> list[int]:
        """Frames (after the first hop) ready only after the clock showed them."""
        return [i for i in sorted(self.ready_at) if i >= 5 and self.ready_at[i] > self.anchor + i / FPS]


def utterance(seconds: float, level: float = 0.4) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (level * np.cos(2 * np.pi * 220 * t)).astype(np.float32)


@pytest.mark.parametrize("phase", [0.0, 0.07, 0.13])
def test_speech_is_shown_depth_plus_lead_after_it_is_pushed_whatever_the_phase(
    engine: Engine, registered_avatar: Avatar, phase: float
) -> None:
    loop = VirtualRuntime(engine, registered_avatar).open()
    pushed = 1.0 + phase
    loop.run(pushed)
    idle_ahead = max(loop.committed_ahead)
    loop.run(pushed + 1.2, utterance(0.6), start=pushed)

    frames = sorted(loop.audio)
    depth = speech_depth(5, 5)
    lead = loop.lead_frames
    assert loop.first_spoken_at() - pushed == pytest.approx((depth + lead) / FPS, abs=0.001), "latency is depth + lead"

    spoken = [i for i in frames if loop.speech[i]]
    assert spoken == list(range(spoken[0], spoken[0] + len(spoken))) and len(spoken) >= 0.6 * FPS, (
        "no silence inside on-time speech"
    )
    assert not loop.late_frames(), "every frame is ready by the time the clock shows it"
    pushed_through = spoken[: -int(np.ceil(depth))]
    slack = min(loop.anchor + i / FPS - loop.ready_at[i] for i in pushed_through)
    assert slack >= (MARGIN / FPS) - TICK - 1e-9, (
        "frames made final by pushed speech are ready the margin ahead (less a tick)"
    )
    assert idle_ahead <= depth + lead, "idle silence is never committed further ahead than speech would be placed"
    assert loop.session.counters["deadline_misses"] == 0
    assert loop.session.stats()["speech_latency_ms"] == pytest.approx((depth + lead) / FPS * 1000, abs=0.1)


def test_a_pusher_that_stalls_gets_silence_just_in_time_and_no_frame_is_late(
    engine: Engine, registered_avatar: Avatar
) -> None:
    loop = VirtualRuntime(engine, registered_avatar).open()
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


def test_sessions_that_start_and_speak_out_of_phase_run_their_windows_in_the_same_ticks(
    engine: Engine, registered_avatar: Avatar
) -> None:
    host = VirtualRuntime(engine, registered_avatar, batched=True)
    starts = [0.0, 0.07, 0.13]
    pushed = 2.03
    loops = []
    while host.now < 4.0:
        if starts[len(loops) :] and host.now >= starts[len(loops)]:
            loops.append(host.open())
            if len(loops) == 3:
                loops[1].say(utterance(0.6), start=pushed)
                loops[2].say(utterance(0.6), start=pushed + 0.11)
        host.tick()

    for loop, start in zip(loops, starts):
        assert loop.anchor / 0.2 == pytest.approx(round(loop.anchor / 0.2), abs=1e-6), (
            "every clock starts on the runtime's 200 ms grid"
        )
        assert loop.anchor - start < 0.2 + 0.2 + 0.055, "its first frame comes at most one hop later than alone"
    steady = [{t for t in loop.window_ticks if t >= 1.0} for loop in loops]
    idle = steady[0]
    assert len(idle) >= 14
    for ticks in steady[1:]:
        late = ticks - idle
        assert len(ticks) == len(idle) and len(late) <= 1, (
            "idle or speaking, every window of a hop runs in the same tick"
        )
        assert all(round(t - TICK, 6) in idle for t in late), (
            "but the one after an utterance, which waits half the margin for a late push"
        )
    for loop in loops:
        assert not loop.late_frames(), "and every frame is ready by the time its clock shows it"
    lead = loops[1].lead_frames
    assert loops[1].first_spoken_at() - pushed == pytest.approx((speech_depth(5, 5) + lead) / FPS, abs=0.001), (
        "latency is unchanged"
    )


def test_an_interrupted_session_runs_its_windows_with_the_others_again(
    engine: Engine, registered_avatar: Avatar
) -> None:
    host = VirtualRuntime(engine, registered_avatar, batched=True)
    loops = [host.open(paced=True) for _ in range(2)]
    speaker = loops[1]
    speaker.say(utterance(2.0), start=1.03)
    while host.now < 5.0:
        now = host.now
        if now == 1.87:  # barge-in: the rest of the utterance and the frames queued for it are dropped
            speaker.pcm = None
            speaker.session.interrupt()
        if now == 2.31:
            speaker.say(utterance(0.6), start=now)
            shown_before = max(speaker.audio)
        host.tick()

    idle = {t for t in loops[0].window_ticks if t >= 1.0}
    after = {t for t in speaker.window_ticks if t >= 1.95}
    assert len(after) >= 14
    apart = after - idle
    assert len(apart) <= 2, (
        f"after its first window and the one after the new utterance, it batches again: apart at {sorted(apart)}"
    )
    taken = sorted(speaker.audio)
    assert taken == list(range(taken[0], taken[-1] + 1)), "the stream goes on through the interrupt without a gap"
    frames = [i for i in taken if i > shown_before]
    audio = np.concatenate([speaker.audio[i] for i in frames])
    first_loud = speaker.shown_at(int(np.flatnonzero(np.abs(audio) > 0.1)[0]) + frames[0] * SINK_RATE // FPS)
    lead = speaker.lead_frames
    assert first_loud - 2.31 == pytest.approx((speech_depth(5, 5) + lead) / FPS, abs=0.001), (
        "the new utterance keeps the latency"
    )
    assert speaker.session.counters["deadline_misses"] == 0


@pytest.mark.parametrize("phase", [0.0, 0.05])
def test_a_low_latency_session_beside_a_faithful_one_shows_speech_after_its_shorter_depth(
    engine: Engine, registered_avatar: Avatar, phase: float
) -> None:
    host = VirtualRuntime(engine, registered_avatar, batched=True)
    faithful, low = host.open(), host.open(latency="low")
    pushed = 1.0 + phase
    host.run(pushed)
    for loop in (faithful, low):
        loop.say(utterance(0.6), start=pushed)
    host.run(pushed + 1.5)

    assert low.first_spoken_at() - pushed == pytest.approx(
        (speech_depth(3, 0, 3) + low.lead_frames) / FPS, abs=0.001
    ), "205 ms of audio after a frame (a 3-frame hop, nothing held, the look-ahead) plus the lead"
    assert faithful.first_spoken_at() - pushed == pytest.approx(
        (speech_depth(5, 5) + faithful.lead_frames) / FPS, abs=0.001
    )
    assert low.first_spoken_at() < faithful.first_spoken_at() - 0.25
    steady = sorted(t for t in low.window_ticks if t >= 0.5)
    gaps = np.round(np.diff(steady), 6)
    assert set(gaps) <= {0.11, 0.12, 0.13} and gaps.mean() == pytest.approx(0.12, abs=0.002), (
        "a window every 120 ms (to a tick)"
    )
    for loop in (faithful, low):
        frames = sorted(loop.audio)
        assert frames == list(range(frames[0], frames[-1] + 1)) and not loop.late_frames()
        assert loop.session.counters["deadline_misses"] == 0

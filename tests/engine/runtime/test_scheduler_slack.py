"""Render jobs (sessions not live) take only the slack the live sessions leave, and the whole GPU when none is open.

The scheduler is planning alone (no device work), so these drive it with plain stand-ins for the sessions' pipelines:
each has a backlog of frames, a window ready and audio chunks waiting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine.runtime.config import RuntimeConfig
from engine.runtime.scheduler import Scheduler

CONFIG = RuntimeConfig(render_frames_per_tick=80, slack_render_ms=8.0, slack_chunks_per_tick=2)
COSTS = {5: 14.0, 10: 27.0, 20: 54.0}
"""Milliseconds per render call by bucket: 2.7 ms a frame at the largest."""


@dataclass
class Seen:
    live: bool
    queued: int = 0

    def room(self) -> int:
        return 25 - self.queued


@dataclass
class Motion:
    chunks: int = 40

    def take_chunks(self, limit: int) -> tuple[np.ndarray, int]:
        taken = min(limit, self.chunks)
        self.chunks -= taken
        return np.zeros((taken, 3200), np.float32), taken


@dataclass
class Pipeline:
    """What the scheduler reads of a session's pipeline."""

    live: bool
    backlog: int
    deadline: float = 0.0
    due: bool = True
    session: Seen = field(init=False)
    motion: Motion = field(default_factory=Motion)

    def __post_init__(self) -> None:
        self.session = Seen(self.live)

    def render_count(self, chunk: int) -> int:
        if self.live:
            return self.backlog
        room = self.session.room()
        return min(self.backlog, room) if room >= min(self.backlog, chunk) else 0

    def next_deadline(self) -> float:
        return self.deadline if self.live else math.inf

    def window_due(self, now: float) -> bool:
        return self.due or not self.live

    def window_request(self) -> object:
        return object()


def planned(batches: list[list]) -> dict[int, int]:
    return {id(job.pipeline): job.count for batch in batches for job in batch}


def test_with_no_live_session_a_job_renders_full_batches_and_all_its_audio() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    job = Pipeline(live=False, backlog=70)

    assert planned(scheduler.frames([job], COSTS)) == {id(job): 25}, "as many as its queue has room for"
    assert sum(j.chunks.shape[0] for b in scheduler.chunks([job]) for j in b) == CONFIG.hubert_chunks_per_tick
    assert len(scheduler.windows([job], 0.0, {})) == 1


def test_beside_live_sessions_a_job_fills_the_padding_and_the_slack_budget_only() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    live = [Pipeline(live=True, backlog=1, deadline=float(i)) for i in range(12)]
    job = Pipeline(live=False, backlog=70)

    counts = planned(scheduler.frames([job, *live], COSTS))
    assert all(counts[id(p)] == 1 for p in live), "every live frame due is rendered first"
    padding = 20 - 12
    assert counts[id(job)] == padding + int(8.0 / 2.7), "the live call's padding, then 8 ms of frames"


def test_a_job_waits_for_ticks_without_live_windows_and_takes_few_chunks_beside_live_sessions() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    live = Pipeline(live=True, backlog=0)
    job, other_job = Pipeline(live=False, backlog=0), Pipeline(live=False, backlog=0)

    windows = scheduler.windows([job, live], 0.0, {})
    assert [j.pipeline for b in windows for j in b] == [live], "a live window due: the job's waits"
    live.due = False
    windows = scheduler.windows([job, other_job, live], 0.0, {})
    assert [j.pipeline for b in windows for j in b] == [job], "no live window: one job's window in this tick"

    chunks = {id(j.pipeline): j.chunks.shape[0] for b in scheduler.chunks([job, live]) for j in b}
    assert chunks == {id(job): 2, id(live): 16}


def test_a_job_with_no_room_in_its_queue_renders_nothing() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    job = Pipeline(live=False, backlog=70)
    job.session.queued = 25

    assert planned(scheduler.frames([job, Pipeline(live=True, backlog=3)], COSTS)).get(id(job)) is None

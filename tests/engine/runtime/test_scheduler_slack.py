"""Render jobs (sessions not live) take only the slack the live sessions leave, and the whole GPU when none is open.

The slack of a tick is the GPU time until the earliest live session next needs the GPU, less a reserve, from when the
GPU will have done the work already queued; a job's chunks, window and frames are planned within it by their measured
costs.
The scheduler is planning alone (no device work), so these drive it with plain stand-ins for the sessions' pipelines:
each has a backlog of frames, a window ready and audio chunks waiting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from engine.runtime.config import RuntimeConfig
from engine.runtime.scheduler import Scheduler
from engine.runtime.slack import GpuQueue

CONFIG = RuntimeConfig(render_frames_per_tick=80, slack_reserve_ms=10.0, slack_chunks_per_tick=2)
COSTS = {5: 14.0, 10: 27.0, 20: 54.0}
"""Milliseconds per render call by bucket: 2.7 ms a frame at the largest."""
WINDOW_COSTS = {1: 20.0, 2: 22.0}
"""Milliseconds per LMDM call by bucket."""
HUBERT = {1: 2.0, 2: 3.0, 16: 9.0}
"""Milliseconds per HuBERT call by bucket."""


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
    work_at: float = -math.inf
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

    def next_work_at(self) -> float:
        return -math.inf if self.backlog else self.work_at


def planned(batches: list[list]) -> dict[int, int]:
    return {id(job.pipeline): job.count for batch in batches for job in batch}


def slack_of(pipelines: list[Pipeline], start: float | None = 0.0, priced: bool = True):
    """The slack of a tick whose work would start on the GPU at ``start`` (None: the GPU runs past its estimate)."""
    return Scheduler(CONFIG, batched=True).slack(pipelines, start, priced)


def test_with_no_live_session_a_job_renders_full_batches_and_all_its_audio() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    job = Pipeline(live=False, backlog=70)
    slack = slack_of([job], start=None)

    assert slack.whole, "nothing to protect: the whole loop, busy GPU or not"
    assert planned(scheduler.frames([job], slack, COSTS)) == {id(job): 25}, "as many as its queue has room for"
    assert sum(j.chunks.shape[0] for b in scheduler.chunks([job], slack) for j in b) == CONFIG.hubert_chunks_per_tick
    assert len(scheduler.windows([job], 0.0, WINDOW_COSTS, slack)) == 1


def test_a_job_takes_the_time_until_the_earliest_live_window_less_the_reserve() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    job = Pipeline(live=False, backlog=70)
    live = [Pipeline(live=True, backlog=0, work_at=1.100), Pipeline(live=True, backlog=0, work_at=1.060)]
    slack = slack_of([job, *live], start=1.0)

    assert slack.ms == pytest.approx(60.0 - 10.0)
    assert planned(scheduler.frames([job, *live], slack, COSTS)) == {id(job): 15}, "10 + 5 (41 ms) fit; 20 (54) not"
    assert slack.ms == pytest.approx(50.0 - 41.0), "what the frames cost is spent"


def test_a_jobs_slack_counts_from_when_the_gpu_is_done_with_the_queued_work() -> None:
    job = Pipeline(live=False, backlog=70)
    live = Pipeline(live=True, backlog=0, work_at=1.2)

    assert slack_of([job, live], start=1.0).ms == pytest.approx(200.0 - 10.0), "an idle GPU: from now"
    assert slack_of([job, live], start=1.15).ms == pytest.approx(50.0 - 10.0), "busy until 1.15 by its calls' costs"
    assert slack_of([job, live], start=None).ms == 0, "busy past its calls' costs: when it frees is unknown"
    assert slack_of([job, live], start=1.3).ms == 0, "a window due before the GPU frees: no slack at all"


def test_the_gpu_queue_adds_each_calls_cost_after_what_is_queued_and_trusts_only_an_estimate_ahead() -> None:
    queue = GpuQueue()
    assert queue.start(10.0, idle=True) == 10.0
    queue.launched(40.0, now=10.0)
    queue.launched(100.0, now=10.01)
    assert queue.start(10.05, idle=False) == pytest.approx(10.14), "the second call runs after the first"
    assert queue.start(10.2, idle=False) is None, "still busy at 10.2: the costs fell short"
    assert queue.start(10.2, idle=True) == 10.2
    queue.launched(5.0, now=10.5)
    assert queue.start(10.5, idle=False) == pytest.approx(10.505), "after an idle spell a call starts when launched"


def test_beside_live_frames_due_a_job_fills_only_the_padding_of_their_call() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    live = [Pipeline(live=True, backlog=1, deadline=float(i)) for i in range(12)]
    job = Pipeline(live=False, backlog=70)
    slack = slack_of([job, *live])

    assert slack.ms == 0, "live frames are due now"
    counts = planned(scheduler.frames([job, *live], slack, COSTS))
    assert all(counts[id(p)] == 1 for p in live), "every live frame due is rendered first"
    assert counts[id(job)] == 20 - 12, "the live call's padding costs nothing"


def test_a_jobs_window_runs_alone_in_a_tick_without_a_live_one_and_only_if_it_fits() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    live = Pipeline(live=True, backlog=0, work_at=0.0)
    job, other_job = Pipeline(live=False, backlog=0), Pipeline(live=False, backlog=0)

    windows = scheduler.windows([job, live], 0.0, WINDOW_COSTS, slack_of([job, live]))
    assert [j.pipeline for b in windows for j in b] == [live], "a live window due: the job's waits"
    live.due, live.work_at = False, 0.060
    slack = slack_of([job, other_job, live])
    windows = scheduler.windows([job, other_job, live], 0.0, WINDOW_COSTS, slack)
    assert [j.pipeline for b in windows for j in b] == [job], "no live window: one job's window in this tick"
    assert slack.ms == pytest.approx(50.0 - 20.0)
    live.work_at = 0.025
    assert scheduler.windows([job, live], 0.0, WINDOW_COSTS, slack_of([job, live])) == [], "15 ms: 20 does not fit"


def test_beside_live_sessions_a_job_encodes_a_few_chunks_a_tick_when_they_fit() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    live = Pipeline(live=True, backlog=0, work_at=0.060)
    job = Pipeline(live=False, backlog=0)

    chunks = {
        id(j.pipeline): j.chunks.shape[0]
        for b in scheduler.chunks([job, live], slack_of([job, live]), HUBERT)
        for j in b
    }
    assert chunks == {id(job): 2, id(live): 16}
    live.work_at = 0.0
    chunks = {
        id(j.pipeline): j.chunks.shape[0]
        for b in scheduler.chunks([job, live], slack_of([job, live]), HUBERT)
        for j in b
    }
    assert chunks == {id(live): 16}, "no slack: the job's audio waits, the live session's does not"


def test_where_nothing_was_measured_a_job_gets_a_least_share_each_tick() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    live = Pipeline(live=True, backlog=3, due=False)
    job = Pipeline(live=False, backlog=70)
    slack = slack_of([job, live], priced=False)

    assert planned(scheduler.frames([job, live], slack, {})) == {id(live): 3, id(job): 2 + 1}, "padding and a frame"
    assert [j.pipeline for b in scheduler.windows([job, live], 0.0, {}, slack) for j in b] == [job]
    assert {j.chunks.shape[0] for b in scheduler.chunks([job], slack) for j in b} == {2}


def test_a_job_with_no_room_in_its_queue_renders_nothing() -> None:
    scheduler = Scheduler(CONFIG, batched=True)
    job = Pipeline(live=False, backlog=70)
    job.session.queued = 25
    live = Pipeline(live=True, backlog=3)

    assert planned(scheduler.frames([job, live], slack_of([job, live]), COSTS)).get(id(job)) is None

"""The batch scheduler: which work of which sessions runs in this tick, and in which batches.

Each stage of a tick is planned once the stage before it has run, because its results make the next
stage's work due: features make windows, windows make frames. The plans are plain data for the
executor: HuBERT chunks (one call for all sessions when they are batched), LMDM windows (one per
session, earliest deadline first, in bucket-sized calls) and frames (earliest deadline first, within
the per-tick budget). Sessions not live (render jobs) beside live ones take only the tick's ``Slack``.
Planning launches no device work; it only takes each session's due work.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.buckets import bucket_for, call_cost, chunk_sizes
from engine.motion_stream import WindowRequest
from engine.runtime.config import RuntimeConfig
from engine.runtime.pipeline import SessionPipeline
from engine.runtime.slack import Slack, tick_slack


class ChunkJob(NamedTuple):
    """One session's HuBERT chunks for this tick, and how many of their features to keep."""

    pipeline: SessionPipeline
    chunks: np.ndarray
    keep: int


class WindowJob(NamedTuple):
    """One session's next LMDM window."""

    pipeline: SessionPipeline
    request: WindowRequest


class FrameJob(NamedTuple):
    """The next ``count`` frames of one session's render backlog."""

    pipeline: SessionPipeline
    count: int


class Scheduler:
    """Plans each stage of a tick across sessions; ``batched``: sessions share calls (see
    ``RuntimeConfig.batch_sessions``)."""

    def __init__(self, config: RuntimeConfig, batched: bool) -> None:
        self.config = config
        self.batched = batched

    def slack(self, pipelines: list[SessionPipeline], start: float | None, priced: bool) -> Slack:
        """The GPU time render jobs may take in a tick whose work would start on the GPU at ``start`` (None: unknown;
        see ``engine.runtime.slack``)."""
        live = [p for p in pipelines if p.session.live]
        return tick_slack(live, start, self.config.slack_reserve_ms, priced)

    def chunks(
        self, pipelines: list[SessionPipeline], slack: Slack, costs: dict[int, float] | None = None
    ) -> list[list[ChunkJob]]:
        """Every session's complete HuBERT chunks (up to the per-tick limit), one encoder call for all (or one per
        session); beside live sessions a job encodes ``slack_chunks_per_tick`` if their call fits (``costs``: ms per
        HuBERT bucket)."""
        chunk_ms = call_cost(self.config.slack_chunks_per_tick, costs) if costs else 0.0
        jobs = []
        for pipeline in pipelines:
            limit = self.config.hubert_chunks_per_tick
            if not pipeline.session.live and not slack.whole:
                limit = min(limit, self.config.slack_chunks_per_tick) if slack.take(chunk_ms) else 0
            chunks, keep = pipeline.motion.take_chunks(limit)
            if chunks.shape[0]:
                jobs.append(ChunkJob(pipeline, chunks, keep))
        return self._group(jobs)

    def windows(
        self, pipelines: list[SessionPipeline], now: float, costs: dict[int, float], slack: Slack
    ) -> list[list[WindowJob]]:
        """Every due window (one per session) in bucket-sized sampler calls, earliest deadline first; ``costs``: ms per
        bucket. Beside live sessions a job's window runs alone, in a tick without a live one, if it fits the slack.

        When sessions are batched, a live session's window waits until it falls due (see ``engine.runtime.pacing``):
        their clocks share one grid, so every session's window of a hop runs in the same call.
        """
        jobs = [
            WindowJob(p, r)
            for p in pipelines
            if (not self.batched or p.window_due(now)) and (r := p.window_request()) is not None
        ]
        jobs.sort(key=lambda job: job.pipeline.next_deadline())
        if any(job.pipeline.session.live for job in jobs):
            jobs = [job for job in jobs if job.pipeline.session.live]
        elif jobs and not slack.whole:
            jobs = jobs[:1] if slack.take(call_cost(1, costs) if costs else 0.0) else []
        if not jobs:
            return []
        if not self.batched:
            return [[job] for job in jobs]
        batches, lo = [], 0
        for size in chunk_sizes(len(jobs), self.config.window_buckets, costs):
            batches.append(jobs[lo : lo + size])
            lo += size
        return batches

    def frames(
        self, pipelines: list[SessionPipeline], slack: Slack, costs: dict[int, float] | None = None
    ) -> list[list[FrameJob]]:
        """Due frames across sessions, earliest deadline first, grouped into one render job for all (or one per
        session); ``costs``: ms per render bucket (measured at warm-up). Beside live sessions the jobs' frames fill
        the padding of the live frames' call, then what ``slack`` has left.

        The per-tick frame budget is shared by all sessions when they are batched; otherwise each session
        has it to itself, so how its frames are grouped never depends on the other sessions.
        """
        budget = self.config.render_frames_per_tick
        chunk = min(self.config.max_queued_frames // 2, max(self.config.render_buckets))
        jobs: list[FrameJob] = []
        padding: int | None = None
        for pipeline in sorted(pipelines, key=lambda p: p.next_deadline()):
            most = min(pipeline.render_count(chunk), budget)
            if not pipeline.session.live and not slack.whole:
                if padding is None:
                    padding = self._padding(sum(job.count for job in jobs))
                free = min(most, padding)
                padding -= free
                most = free + slack.frames(most - free, costs or {})
            if most <= 0:
                continue
            jobs.append(FrameJob(pipeline, most))
            if self.batched:
                budget -= most
                if budget <= 0:
                    break
        return self._group(jobs)

    def _padding(self, live_frames: int) -> int:
        """Rows the render call of ``live_frames`` live frames pads with (free for a job's frames)."""
        buckets = self.config.render_buckets
        return bucket_for(live_frames, buckets) - live_frames if 0 < live_frames <= max(buckets) else 0

    def _group(self, jobs: list) -> list[list]:
        """All jobs in one call when sessions are batched, else one call each; no calls for no jobs."""
        if not jobs:
            return []
        return [jobs] if self.batched else [[job] for job in jobs]

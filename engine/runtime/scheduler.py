"""The batch scheduler: which work of which sessions runs in this tick, and in which batches.

Each stage of a tick is planned once the stage before it has run, because its results make the next
stage's work due: features make windows, windows make frames. The plans are plain data for the
executor: HuBERT chunks (one call for all sessions when they are batched), LMDM windows (one per
session, earliest deadline first, in bucket-sized calls) and frames (earliest deadline first, within
the per-tick budget). Planning launches no device work; it only takes each session's due work.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.buckets import bucket_for, chunk_sizes
from engine.motion_stream import WindowRequest
from engine.runtime.config import RuntimeConfig
from engine.runtime.pipeline import SessionPipeline


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

    def chunks(self, pipelines: list[SessionPipeline]) -> list[list[ChunkJob]]:
        """Every session's complete HuBERT chunks (up to the per-tick limit), one encoder call for all (or one per
        session)."""
        jobs = []
        live = has_live(pipelines)
        for pipeline in pipelines:
            limit = self.config.hubert_chunks_per_tick
            if live and not pipeline.session.live:
                limit = min(limit, self.config.slack_chunks_per_tick)
            chunks, keep = pipeline.motion.take_chunks(limit)
            if chunks.shape[0]:
                jobs.append(ChunkJob(pipeline, chunks, keep))
        return self._group(jobs)

    def windows(self, pipelines: list[SessionPipeline], now: float, costs: dict[int, float]) -> list[list[WindowJob]]:
        """Every due window (one per session) in bucket-sized sampler calls, earliest deadline first; ``costs``: ms per
        bucket.

        When sessions are batched, a live session's window waits until it falls due (see ``engine.runtime.pacing``):
        their clocks share one grid, so every session's window of a hop runs in the same call.
        """
        jobs = [
            WindowJob(p, r)
            for p in pipelines
            if (not self.batched or p.window_due(now)) and (r := p.window_request()) is not None
        ]
        if not jobs:
            return []
        jobs.sort(key=lambda job: job.pipeline.next_deadline())
        if any(job.pipeline.session.live for job in jobs):
            jobs = [job for job in jobs if job.pipeline.session.live]
        elif has_live(pipelines):
            jobs = jobs[:1]
        if not self.batched:
            return [[job] for job in jobs]
        batches, lo = [], 0
        for size in chunk_sizes(len(jobs), self.config.window_buckets, costs):
            batches.append(jobs[lo : lo + size])
            lo += size
        return batches

    def frames(self, pipelines: list[SessionPipeline], costs: dict[int, float] | None = None) -> list[list[FrameJob]]:
        """Due frames across sessions, earliest deadline first, grouped into one render job for all (or one per
        session); ``costs``: ms per render bucket (measured at warm-up), which sizes the slack of sessions not live.

        The per-tick frame budget is shared by all sessions when they are batched; otherwise each session
        has it to itself, so how its frames are grouped never depends on the other sessions.
        """
        budget = self.config.render_frames_per_tick
        chunk = min(self.config.max_queued_frames // 2, max(self.config.render_buckets))
        jobs: list[FrameJob] = []
        slack: int | None = None
        live = has_live(pipelines)
        for pipeline in sorted(pipelines, key=lambda p: p.next_deadline()):
            if live and not pipeline.session.live and slack is None:
                slack = self._slack_frames(sum(job.count for job in jobs), costs or {})
            count = min(pipeline.render_count(chunk), budget, budget if slack is None else slack)
            if count <= 0:
                continue
            jobs.append(FrameJob(pipeline, count))
            if slack is not None:
                slack -= count
            if self.batched:
                budget -= count
                if budget <= 0:
                    break
        return self._group(jobs)

    def _slack_frames(self, live_frames: int, costs: dict[int, float]) -> int:
        """Frames the sessions not live may add to a tick whose live sessions render ``live_frames``: the padding of
        their render call, and as many as ``slack_render_ms`` renders (at least one a tick)."""
        buckets = self.config.render_buckets
        padding = bucket_for(live_frames, buckets) - live_frames if 0 < live_frames <= max(buckets) else 0
        largest = max(buckets)
        per_frame = costs.get(largest, 0.0) / largest
        extra = int(self.config.slack_render_ms / per_frame) if per_frame > 0 else 1
        return padding + max(extra, 1)

    def _group(self, jobs: list) -> list[list]:
        """All jobs in one call when sessions are batched, else one call each; no calls for no jobs."""
        if not jobs:
            return []
        return [jobs] if self.batched else [[job] for job in jobs]


def has_live(pipelines: list[SessionPipeline]) -> bool:
    """Whether any live session is open (then the others take only the slack)."""
    return any(p.session.live for p in pipelines)

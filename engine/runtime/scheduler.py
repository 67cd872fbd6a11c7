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

from engine.buckets import chunk_sizes
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
        for pipeline in pipelines:
            chunks, keep = pipeline.motion.take_chunks(self.config.hubert_chunks_per_tick)
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
        if not self.batched:
            return [[job] for job in jobs]
        batches, lo = [], 0
        for size in chunk_sizes(len(jobs), self.config.window_buckets, costs):
            batches.append(jobs[lo : lo + size])
            lo += size
        return batches

    def frames(self, pipelines: list[SessionPipeline]) -> list[list[FrameJob]]:
        """Due frames across sessions, earliest deadline first, grouped into one render job for all (or one per
        session).

        The per-tick frame budget is shared by all sessions when they are batched; otherwise each session
        has it to itself, so how its frames are grouped never depends on the other sessions.
        """
        budget = self.config.render_frames_per_tick
        chunk = min(self.config.max_queued_frames // 2, max(self.config.render_buckets))
        jobs = []
        for pipeline in sorted(pipelines, key=SessionPipeline.next_deadline):
            count = min(pipeline.render_count(chunk), budget)
            if count <= 0:
                continue
            jobs.append(FrameJob(pipeline, count))
            if self.batched:
                budget -= count
                if budget <= 0:
                    break
        return self._group(jobs)

    def _group(self, jobs: list) -> list[list]:
        """All jobs in one call when sessions are batched, else one call each; no calls for no jobs."""
        if not jobs:
            return []
        return [jobs] if self.batched else [[job] for job in jobs]

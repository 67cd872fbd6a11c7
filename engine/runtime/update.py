"""The update step: hands the executor's results back to the sessions' pipelines.

Features join their motion streams, sampled windows their render backlogs, rendered images become
frames delivered to their sessions; after the tick, each pipeline notes which frames are ready
(its clock and deadlines) and a session whose every frame was delivered is finished.
"""

from __future__ import annotations

import torch

from engine.audio.hubert import FEATURE_DIM, valid_features
from engine.runtime.executor import PosedJob, Rendered
from engine.runtime.pipeline import SessionPipeline
from engine.runtime.scheduler import ChunkJob, WindowJob


def add_features(batch: list[ChunkJob], encodings: torch.Tensor) -> None:
    """Give each session of ``batch`` the features of its own chunks (those it keeps), cut from their encodings at its
    hop: one cut of the whole batch per hop in use, each session's a view of it."""
    by_hop = {hop: valid_features(encodings, hop) for hop in {job.pipeline.hop for job in batch}}
    offset = 0
    for job in batch:
        count = job.chunks.shape[0]
        features = by_hop[job.pipeline.hop][offset : offset + count].reshape(-1, FEATURE_DIM)
        job.pipeline.motion.add_features(features[: job.keep])
        offset += count


def complete_windows(batch: list[WindowJob], windows: torch.Tensor) -> None:
    """Give each session of ``batch`` its sampled window."""
    for i, job in enumerate(batch):
        job.pipeline.complete(windows[i])


def deliver_frames(batch: list[PosedJob], rendered: Rendered) -> None:
    """Hand each session of ``batch`` its rendered frames."""
    for job, images in zip(batch, rendered.images):
        job.pipeline.deliver(job.motion, images, rendered.ready)


def settle(pipelines: list[SessionPipeline], now: float) -> list[SessionPipeline]:
    """Note the frames ready by ``now`` (clocks, deadline misses); finish the sessions that are done and return their
    pipelines."""
    finished = []
    for pipeline in pipelines:
        pipeline.check_deadlines(now)
        if pipeline.done and not pipeline.in_flight:
            pipeline.session.finish()
            finished.append(pipeline)
    return finished

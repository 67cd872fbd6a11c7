"""The executor: runs the scheduler's batches on the engine and returns their results, one stage at a time.

HuBERT encoding, LMDM sampling, and warp+decode in bucket-sized calls with each frame pasted back
into its avatar. A CUDA out-of-memory error in the sampler or the renderer is reported, the cache
freed and the batch left for the next tick (its sessions go on); any other error is the caller's.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import torch

from engine.audio.hubert import encodings
from engine.buckets import chunk_sizes
from engine.diffusion.graphed import BucketedSampler
from engine.engine import Engine
from engine.motion.stitching import Posed, join_frames
from engine.runtime.config import RuntimeConfig
from engine.runtime.pipeline import SessionPipeline
from engine.runtime.scheduler import ChunkJob, WindowJob

log = logging.getLogger("ditto.runtime")


class PosedJob(NamedTuple):
    """One session's frames to render: their motion, avatar rows, and per-session stitching steps (see
    ``SessionPipeline.pose``)."""

    pipeline: SessionPipeline
    motion: torch.Tensor
    rows: torch.Tensor
    posed: Posed


class Rendered(NamedTuple):
    """The frames of a render batch: each job's images (in the batch's order), and the event that marks them done
    (CUDA)."""

    images: list[torch.Tensor]
    ready: torch.cuda.Event | None


class Executor:
    """Runs batches on ``engine``; counts out-of-memory errors in ``counters["oom_errors"]``."""

    def __init__(
        self, engine: Engine, sampler: BucketedSampler, config: RuntimeConfig, counters: dict[str, int]
    ) -> None:
        self.engine = engine
        self.sampler = sampler
        self.config = config
        self.counters = counters

    def encode(self, batch: list[ChunkJob]) -> torch.Tensor:
        """The HuBERT encodings of every chunk of ``batch``, in one encoder call, in the batch's order (each session
        cuts
        its features at its own hop: ``update.add_features``)."""
        return encodings(self.engine.hubert, np.concatenate([job.chunks for job in batch]))

    def sample(self, batch: list[WindowJob]) -> torch.Tensor | None:
        """The windows of ``batch`` in one sampler call (None after an out-of-memory error: retried next tick)."""
        requests = [job.request for job in batch]
        try:
            return self.sampler(
                torch.stack([r.noise for r in requests]),
                torch.stack([r.cond_frame for r in requests]),
                torch.stack([r.cond for r in requests]),
                torch.stack([r.step_noise for r in requests], dim=1),
            )
        except torch.OutOfMemoryError:
            self._out_of_memory("LMDM sampling", [job.pipeline for job in batch])
            return None

    def render(
        self, batch: list[PosedJob], x_s: torch.Tensor, x_d: torch.Tensor, costs: dict[int, float]
    ) -> Rendered | None:
        """Warp+decode the frames of ``batch`` (stitched: ``x_s``, ``x_d``) in bucket-sized calls (``costs``: ms per
        bucket),
        pasting each back into its avatar (None after an out-of-memory error: retried next tick)."""
        features = torch.cat([job.pipeline.avatar.f_s[job.rows] for job in batch])
        bounds, start = [], 0
        for job in batch:
            bounds.append((job.pipeline, job.rows, start, start + job.rows.shape[0]))
            start += job.rows.shape[0]
        images: dict[int, list[torch.Tensor]] = {id(job.pipeline): [] for job in batch}
        lo = 0
        try:
            for size in chunk_sizes(start, self.config.render_buckets, costs):
                hi = lo + size
                rgb = self.engine.backend.render(features[lo:hi], x_s[lo:hi], x_d[lo:hi])
                _paste_by_avatar(rgb, lo, hi, bounds, images)
                lo = hi
        except torch.OutOfMemoryError:
            self._out_of_memory("render", [job.pipeline for job in batch])
            return None
        ready = None
        if self.engine.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        return Rendered([join_frames(images[id(job.pipeline)]) for job in batch], ready)

    def _out_of_memory(self, stage: str, pipelines: list[SessionPipeline]) -> None:
        """A CUDA OOM in a batched stage: report it, free the cache; the batch is retried next tick, other sessions go
        on."""
        self.counters["oom_errors"] += 1
        log.error(
            "CUDA out of memory during %s for sessions %s; retrying next tick", stage, [p.session.id for p in pipelines]
        )
        torch.cuda.empty_cache()


def _paste_by_avatar(
    rgb: torch.Tensor, lo: int, hi: int, bounds: list[tuple], images: dict[int, list[torch.Tensor]]
) -> None:
    """Paste the renders of frames [lo, hi) back into their avatars' frames, appending each session's to ``images``:
    one call per avatar, however many sessions share it (a studio's anchor on several streams)."""
    groups: dict[int, list[tuple[SessionPipeline, torch.Tensor, torch.Tensor]]] = {}
    for pipeline, rows, first, last in bounds:
        a, b = max(lo, first), min(hi, last)
        if a < b:
            groups.setdefault(id(pipeline.avatar), []).append(
                (pipeline, rgb[a - lo : b - lo], rows[a - first : b - first])
            )
    for parts in groups.values():
        pasted = parts[0][0].avatar.paste(
            join_frames([render for _, render, _ in parts]), join_frames([rows for *_, rows in parts])
        )
        for (pipeline, _, _rows), image in zip(parts, pasted.split([rows.shape[0] for *_, rows in parts])):
            images[id(pipeline)].append(image)

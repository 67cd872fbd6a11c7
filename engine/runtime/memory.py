"""GPU memory of a runtime: what it needs for the sessions it is sized for, known before it warms up, and what
its warm-up steps left reserved in torch's caching allocator.

The need is the one memory pool of its captured graphs (the largest graph's working memory: the render's, per
frame of its largest bucket, or the LMDM's, per window) plus each session's state and a margin for the work
outside the graphs. The per-frame and per-window figures were measured with the torch backend in fp16 on the
networks' compiled packages (docs/memory.md); weights are already loaded when the need is checked.

The allocator maps its memory in expandable segments unless the user configured it otherwise: the render graph's
working memory is then the sum of what it holds at its peak, not of the fixed-size segments its tensors were cut
from (about 0.6 of it).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import NamedTuple

import torch

from engine.runtime.config import RuntimeConfig
from engine.runtime.errors import OutOfMemoryAtStart

GIB = 2**30
EXPANDABLE = "expandable_segments:True"
RENDER_FRAME_BYTES = {True: int(0.33 * GIB), False: int(0.56 * GIB)}
"""Working memory of warp+decode per frame of a bucket, with and without expandable segments (its warm-up run's
peak, which its capture then reuses)."""
WINDOW_BYTES = int(0.03 * GIB)
"""Working memory of the LMDM sampler per window of a bucket."""
SESSION_BYTES = 72 * 2**20
"""A session's state and queued frames, with its image avatar's tensors (a video avatar adds its frames)."""
MARGIN_BYTES = int(0.5 * GIB)
"""Outside the graphs: the audio encoder's graphs, stitching, paste-back and frames on their way out."""


class Reserve(NamedTuple):
    """Bytes the allocator holds now (``reserved``) and has held at most since the process started (``peak``)."""

    reserved: int
    peak: int


def reserve(device: torch.device) -> Reserve:
    """The allocator's reserve on ``device`` now and at its peak (zeros off CUDA)."""
    if device.type != "cuda":
        return Reserve(0, 0)
    return Reserve(torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device))


class Need(NamedTuple):
    """Bytes a runtime needs beyond its loaded networks, by part."""

    graphs: int
    sessions: int
    margin: int

    @property
    def total(self) -> int:
        return self.graphs + self.sessions + self.margin


def expandable_segments() -> bool:
    """Turn the caching allocator's expandable segments on where the user set no ``PYTORCH_CUDA_ALLOC_CONF``; whether
    they are on."""
    settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if not settings:
        torch._C._accelerator_setAllocatorSettings(EXPANDABLE)
        return True
    return EXPANDABLE in settings.replace(" ", "")


def need(config: RuntimeConfig, sessions: int, expandable: bool = True) -> Need:
    """What a runtime with ``config``'s buckets needs for ``sessions`` sessions (its graphs share one pool)."""
    render = max(config.render_buckets) * RENDER_FRAME_BYTES[expandable]
    return Need(max(render, max(config.window_buckets) * WINDOW_BYTES), sessions * SESSION_BYTES, MARGIN_BYTES)


def most_sessions(config: RuntimeConfig, free: int, limit: int, expandable: bool = True) -> int:
    """The most sessions, up to ``limit``, whose sized runtime fits ``free`` bytes (0: not even one)."""
    fits = [n for n in range(1, limit + 1) if need(replace(config, sessions=n).sized(), n, expandable).total <= free]
    return max(fits, default=0)


def free_bytes(device: torch.device) -> int | None:
    """Bytes a runtime can still take on ``device``: the driver's free memory and the allocator's unused reserve
    (None off CUDA, where nothing is checked)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def check(config: RuntimeConfig, free: int, gpu: str, expandable: bool = True) -> RuntimeConfig:
    """``config`` sized to what ``free`` bytes hold: as asked when ``config.sessions`` fits, else ``OutOfMemoryAtStart``
    in one line; without ``sessions``, every bucket when that fits, else sized for as many sessions as fit."""
    limit = config.sessions or max(config.window_buckets)
    fit = most_sessions(config, free, limit, expandable)
    if fit == limit:
        return config.sized()
    if config.sessions is None and fit:
        return replace(config, sessions=fit).sized()
    wanted = need(replace(config, sessions=limit).sized(), limit, expandable)
    advice = f"{fit} fit: ask for sessions={fit}" if fit else "not even one fits: free the GPU or use a larger one"
    raise OutOfMemoryAtStart(
        f"GPU memory: a runtime for {limit} session(s) needs {wanted.total / GIB:.1f} GiB more (graphs "
        f"{wanted.graphs / GIB:.1f}, sessions {wanted.sessions / GIB:.1f}, margin {wanted.margin / GIB:.1f}) and {gpu} "
        f"has {free / GIB:.1f} GiB free; {advice}"
    )

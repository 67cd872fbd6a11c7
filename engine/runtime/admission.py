"""How many live sessions one runtime can serve in real time, from the costs measured at warm-up. Pure functions."""

from __future__ import annotations

from engine.runtime.buckets import bucket_for, chunk_sizes
from engine.session import FPS, HOP_FRAMES

HOP_SECONDS = HOP_FRAMES / FPS
MAX_SESSIONS = 256


def batched_cost(count: int, costs: dict[int, float]) -> float:
    """Milliseconds to run ``count`` rows in bucket-sized calls, given the measured ms per call of each bucket."""
    if count <= 0:
        return 0.0
    buckets = tuple(costs)
    return sum(costs[bucket_for(size, buckets)] for size in chunk_sizes(count, buckets))


def hop_cost(sessions: int, overlap: int, window_ms: dict[int, float], render_ms: dict[int, float], seq_frames: int = 80) -> float:
    """GPU milliseconds per 200 ms hop for ``sessions`` live sessions at ``overlap`` (windows every 80 − overlap frames)."""
    windows_per_hop = HOP_FRAMES / (seq_frames - overlap)
    return windows_per_hop * batched_cost(sessions, window_ms) + batched_cost(sessions * HOP_FRAMES, render_ms)


def capacity(overlap: int, window_ms: dict[int, float], render_ms: dict[int, float], utilization: float) -> int:
    """The most live sessions whose hop cost fits ``utilization`` of a hop's 200 ms."""
    budget = utilization * HOP_SECONDS * 1000
    best = 0
    for sessions in range(1, MAX_SESSIONS + 1):
        if hop_cost(sessions, overlap, window_ms, render_ms) > budget:
            break
        best = sessions
    return best

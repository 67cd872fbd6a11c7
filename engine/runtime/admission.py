"""How many live sessions one runtime can serve in real time, from the costs measured at warm-up. Pure functions."""

from __future__ import annotations

from engine.runtime.buckets import call_cost
from engine.session import FPS, HOP_FRAMES

HOP_SECONDS = HOP_FRAMES / FPS
MAX_SESSIONS = 256


def hop_cost(sessions: int, overlap: int, window_ms: dict[int, float], render_ms: dict[int, float], seq_frames: int = 80) -> float:
    """GPU milliseconds per 200 ms hop for ``sessions`` live sessions at ``overlap`` (windows every 80 − overlap frames)."""
    windows_per_hop = HOP_FRAMES / (seq_frames - overlap)
    return windows_per_hop * call_cost(sessions, window_ms) + call_cost(sessions * HOP_FRAMES, render_ms)


def hop_latency(sessions: int, window_ms: dict[int, float], render_ms: dict[int, float]) -> float:
    """GPU milliseconds from a hop's audio to its frames when ``sessions`` live sessions' hops land in one tick:
    one window each, batched, then their frames, batched (what a live session's lead must cover)."""
    return call_cost(sessions, window_ms) + call_cost(sessions * HOP_FRAMES, render_ms)


def capacity(overlap: int, window_ms: dict[int, float], render_ms: dict[int, float], utilization: float) -> int:
    """The most live sessions whose hop cost fits ``utilization`` of a hop's 200 ms."""
    budget = utilization * HOP_SECONDS * 1000
    best = 0
    for sessions in range(1, MAX_SESSIONS + 1):
        if hop_cost(sessions, overlap, window_ms, render_ms) > budget:
            break
        best = sessions
    return best

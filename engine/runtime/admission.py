"""How many live sessions one runtime can serve in real time, from the costs measured at warm-up. Pure functions."""

from __future__ import annotations

from engine.buckets import call_cost
from engine.timebase import FPS, HOP_FRAMES, SEQ_FRAMES

HOP_SECONDS = HOP_FRAMES / FPS
MAX_SESSIONS = 256


def hop_cost(
    sessions: int, overlap: int, window_ms: dict[int, float], render_ms: dict[int, float], seq_frames: int = SEQ_FRAMES
) -> float:
    """GPU milliseconds per 200 ms hop for ``sessions`` live sessions at ``overlap`` (windows every 80 − overlap
    frames)."""
    return load_cost({seq_frames - overlap: sessions}, window_ms, render_ms)


def load_cost(groups: dict[int, int], window_ms: dict[int, float], render_ms: dict[int, float]) -> float:
    """GPU milliseconds per 200 ms hop for live sessions grouped by their window's new frames (``valid`` -> sessions).

    Each group samples its windows in one batch, ``HOP_FRAMES / valid`` times a hop; a group whose windows come
    more often than a hop (the low-latency mode) also renders each window's frames apart, in smaller batches.
    """
    cost = 0.0
    for valid, sessions in groups.items():
        if sessions <= 0:
            continue
        cost += HOP_FRAMES / valid * call_cost(sessions, window_ms)
        frames = min(valid, HOP_FRAMES)
        cost += HOP_FRAMES / frames * call_cost(sessions * frames, render_ms)
    return cost


def fits(groups: dict[int, int], window_ms: dict[int, float], render_ms: dict[int, float], utilization: float) -> bool:
    """Whether live sessions grouped as in ``load_cost`` fit ``utilization`` of a hop's 200 ms."""
    return load_cost(groups, window_ms, render_ms) <= utilization * HOP_SECONDS * 1000


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

"""Fixed batch buckets: every batch the GPU sees is one of a few sizes, compiled and captured at warm-up.

Pure functions: which bucket a batch pads to, and how a larger batch splits into bucket-sized
calls, either with the least padding or, given each bucket's measured cost, at the least cost.
"""

from __future__ import annotations

from functools import lru_cache

WINDOW_BUCKETS = (1, 2, 4, 8, 16)
"""LMDM windows per sampler call (one window per session per tick)."""
RENDER_BUCKETS = (5, 10, 20)
"""Frames per warp+decode call (a live session brings 5 per 200 ms hop). None larger: a larger call renders no more
frames per second, and its captured graph's memory grows with its frames (docs/memory.md)."""


def bucket_for(count: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``count`` rows (``count`` must not exceed the largest)."""
    if count < 1:
        raise ValueError(f"a batch needs at least one row, got {count}")
    for bucket in sorted(buckets):
        if bucket >= count:
            return bucket
    raise ValueError(f"{count} rows exceed the largest bucket {max(buckets)}; split with chunk_sizes first")


def sized(buckets: tuple[int, ...], rows: int) -> tuple[int, ...]:
    """The buckets up to the smallest that holds ``rows`` (all of them when none does): larger ones would never fill."""
    kept = tuple(b for b in sorted(buckets) if b < rows)
    return kept + tuple(b for b in sorted(buckets) if b >= rows)[:1]


def chunk_sizes(count: int, buckets: tuple[int, ...], costs: dict[int, float] | None = None) -> list[int]:
    """Split ``count`` rows into calls of at most the largest bucket each.

    With ``costs`` (ms per call of each bucket) the split is the cheapest; without, the one with
    the least padding (fewest calls among those).
    """
    if count <= 0:
        return []
    table = costs if costs else {b: b + 1e-3 for b in buckets}
    return list(_cheapest(count, tuple(sorted(table.items()))))


@lru_cache(maxsize=4096)
def _cheapest(count: int, table: tuple[tuple[int, float], ...]) -> tuple[int, ...]:
    """Sizes of the calls that cover ``count`` rows at the least total cost (dynamic programming over the row count)."""
    best: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for n in range(1, count + 1):
        options = []
        for bucket, cost in table:
            size = min(bucket, n)
            if bucket >= n or bucket == size:
                total, calls = best[n - size]
                options.append((total + cost, (size, *calls)))
        best.append(min(options, key=lambda item: (item[0], len(item[1]))))
    return best[count][1]


def call_cost(count: int, costs: dict[int, float]) -> float:
    """Milliseconds to run ``count`` rows split at the least cost."""
    return sum(costs[bucket_for(size, tuple(costs))] for size in chunk_sizes(count, tuple(costs), costs))

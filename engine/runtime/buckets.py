"""Fixed batch buckets: every batch the GPU sees is one of a few sizes, compiled and captured at warm-up.

Pure functions: which bucket a batch pads to, and how a larger batch splits into bucket-sized chunks.
"""

from __future__ import annotations

WINDOW_BUCKETS = (1, 2, 4, 8, 16)
"""LMDM windows per sampler call (one window per session per tick)."""
RENDER_BUCKETS = (5, 10, 20, 40)
"""Frames per warp+decode call (a live session brings 5 per 200 ms hop)."""


def bucket_for(count: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``count`` rows (``count`` must not exceed the largest)."""
    if count < 1:
        raise ValueError(f"a batch needs at least one row, got {count}")
    for bucket in sorted(buckets):
        if bucket >= count:
            return bucket
    raise ValueError(f"{count} rows exceed the largest bucket {max(buckets)}; split with chunk_sizes first")


def chunk_sizes(count: int, buckets: tuple[int, ...]) -> list[int]:
    """Split ``count`` rows into chunks of at most the largest bucket, the largest chunks first."""
    largest = max(buckets)
    full, rest = divmod(count, largest)
    return [largest] * full + ([rest] if rest else [])


def padding_waste(count: int, buckets: tuple[int, ...]) -> int:
    """Rows of padding the GPU computes for ``count`` real rows."""
    return sum(bucket_for(size, buckets) - size for size in chunk_sizes(count, buckets))

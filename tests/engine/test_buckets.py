"""Buckets: every batch pads to a captured size; larger batches split at the least padding or the least measured
cost."""

from __future__ import annotations

import pytest

from engine.buckets import RENDER_BUCKETS, WINDOW_BUCKETS, bucket_for, call_cost, chunk_sizes, sized

MEASURED_RENDER_MS = {5: 13.5, 10: 24.7, 20: 52.0}
MEASURED_WINDOW_MS = {1: 26.9, 2: 28.2, 4: 30.1, 8: 36.9, 16: 56.1}


def test_a_batch_pads_to_the_smallest_bucket_that_holds_it() -> None:
    assert [bucket_for(n, WINDOW_BUCKETS) for n in (1, 2, 3, 5, 16)] == [1, 2, 4, 8, 16]
    assert bucket_for(7, RENDER_BUCKETS) == 10
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        bucket_for(17, WINDOW_BUCKETS)


@pytest.mark.parametrize("count", [1, 4, 5, 7, 25, 33, 40, 41, 123])
def test_every_split_covers_the_rows_and_fits_the_buckets(count: int) -> None:
    for costs in (None, MEASURED_RENDER_MS):
        sizes = chunk_sizes(count, RENDER_BUCKETS, costs)
        assert sum(sizes) == count and all(1 <= s <= max(RENDER_BUCKETS) for s in sizes)


def test_without_costs_the_split_pads_least() -> None:
    assert chunk_sizes(25, RENDER_BUCKETS) == [5, 20]
    assert chunk_sizes(80, RENDER_BUCKETS) == [20, 20, 20, 20]


def test_with_costs_few_windows_share_one_call_since_a_window_batch_is_nearly_free() -> None:
    assert chunk_sizes(3, WINDOW_BUCKETS, MEASURED_WINDOW_MS) == [3]
    assert call_cost(3, MEASURED_WINDOW_MS) == MEASURED_WINDOW_MS[4]
    assert call_cost(25, MEASURED_RENDER_MS) == pytest.approx(MEASURED_RENDER_MS[5] + 2 * MEASURED_RENDER_MS[10])


def test_a_runtime_sized_for_fewer_rows_keeps_the_buckets_up_to_the_first_that_holds_them() -> None:
    assert sized(WINDOW_BUCKETS, 1) == (1,)
    assert sized(WINDOW_BUCKETS, 3) == (1, 2, 4)
    assert sized(RENDER_BUCKETS, 5) == (5,)
    assert sized(RENDER_BUCKETS, 80) == RENDER_BUCKETS

"""The replica's health rule for a loop stuck inside a tick (its core still answers, its tick counter stands still)."""

from __future__ import annotations

from cluster.replica import TickWatch


def test_a_tick_counter_standing_still_with_live_sessions_is_a_stopped_loop() -> None:
    watch = TickWatch(seconds=5.0)
    assert watch.stalled(100, live=2, now=0.0) is None
    assert watch.stalled(130, live=2, now=3.0) is None
    assert watch.stalled(130, live=2, now=7.0) is None
    reason = watch.stalled(130, live=2, now=8.5)
    assert reason is not None and "not ticked for 6 s with 2 live session(s)" in reason


def test_an_idle_loop_or_a_runtime_without_the_counter_is_never_stopped() -> None:
    idle = TickWatch(seconds=5.0)
    for now in (0.0, 10.0, 20.0):
        assert idle.stalled(7, live=0, now=now) is None  # no live session: no work, no ticks
    assert idle.stalled(7, live=1, now=24.0) is None  # the first session: the clock starts now
    unwatched = TickWatch(seconds=5.0)
    for now in (0.0, 10.0, 20.0):
        assert unwatched.stalled(None, live=3, now=now) is None

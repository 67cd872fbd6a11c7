"""The replica's health rule: a loop stuck inside a tick (its core still answers, its tick counter stands still) is
stopped; a slow loop (ticks of seconds, as on the CPU) is not. Its render jobs' folder and limits, from its config."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from cluster.replica import (
    CPU_HEALTH_TIMEOUT,
    HEALTH_TIMEOUT,
    TickWatch,
    default_health_timeout,
    render_limits,
    replica_renders,
)
from serving.renders import RenderLimits


def test_a_tick_counter_standing_still_past_the_floor_with_live_sessions_is_a_stopped_loop() -> None:
    watch = TickWatch(floor=5.0)
    assert watch.stalled(100, 40.0, live=2, now=0.0) is None
    assert watch.stalled(130, 40.0, live=2, now=3.0) is None
    assert watch.stalled(130, 40.0, live=2, now=7.0) is None
    reason = watch.stalled(130, 40.0, live=2, now=8.5)
    assert reason is not None and "not ticked for 6 s with 2 live session(s) (the limit: 5 s" in reason, reason


def test_a_slow_loop_may_stand_still_for_several_of_its_slowest_ticks() -> None:
    watch = TickWatch(floor=5.0, factor=4.0)
    assert watch.limit(3000.0) == 12.0
    assert watch.stalled(10, 3000.0, live=1, now=0.0) is None
    assert watch.stalled(10, 3000.0, live=1, now=11.0) is None  # past the floor, within 4 x 3 s
    assert watch.stalled(11, 3000.0, live=1, now=20.0) is None  # it ticked: the clock starts again
    reason = watch.stalled(11, 3000.0, live=1, now=33.0)
    assert reason is not None and "the limit: 12 s, 4 x its slowest recent tick (3.0 s)" in reason, reason


def test_an_idle_loop_or_a_runtime_without_the_counter_is_never_stopped() -> None:
    idle = TickWatch(floor=5.0)
    for now in (0.0, 10.0, 20.0):
        assert idle.stalled(7, None, live=0, now=now) is None  # no live session: no work, no ticks
    assert idle.stalled(7, None, live=1, now=24.0) is None  # the first session: the clock starts now
    unwatched = TickWatch(floor=5.0)
    for now in (0.0, 10.0, 20.0):
        assert unwatched.stalled(None, None, live=3, now=now) is None


def test_the_floor_on_the_cpu_covers_a_first_window_no_tick_has_timed_yet() -> None:
    assert default_health_timeout("cuda") == HEALTH_TIMEOUT
    assert default_health_timeout("cpu") == CPU_HEALTH_TIMEOUT > HEALTH_TIMEOUT


def test_each_replica_writes_its_jobs_into_a_folder_of_its_own_and_a_bad_renders_config_fails_the_deploy() -> None:
    given = asdict(RenderLimits(Path("/data/renders"), Path("/data/clips"), queue=2))
    limits = replica_renders(given, "x7k2")
    assert limits.folder == Path("/data/renders/replica-x7k2") and limits.audio_folder == Path("/data/clips")
    assert (limits.queue, limits.max_mb) == (2, 64.0) and replica_renders(None, "x7k2") is None
    assert render_limits({"folder": "/data/renders", "max_mb": 8}).max_mb == 8, "a serve config's mapping"
    for bad, text in (({"folder": "renders"}, "absolute"), ({"folder": "/r", "size": 1}, "unknown field")):
        with pytest.raises(ValueError, match=text):
            render_limits(bad)

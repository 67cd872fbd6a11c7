"""A runtime is sized for the sessions it is asked for: its buckets, its admission, and the GPU memory it checks
before warming up (the free memory is the device's, faked here: the CPU reports none)."""

from __future__ import annotations

import pytest

from engine.runtime import AdmissionError, OutOfMemoryAtStart, Runtime, RuntimeConfig, memory

GIB = 2**30


def test_a_runtime_for_one_session_warms_up_only_the_smallest_buckets_and_admits_one_live_session(
    engine, registered_avatar
) -> None:
    with Runtime(engine, RuntimeConfig(sessions=1, admission=True, progress=False), start=False) as runtime:
        assert runtime.warmup_steps() == [("render frames", 5), ("LMDM windows", 1)]
        assert runtime.config.window_buckets == (1,) and runtime.config.render_buckets == (5,)
        runtime.open_session(registered_avatar, live=True)
        with pytest.raises(AdmissionError, match="sized for 1 live session"):
            runtime.open_session(registered_avatar, live=True)
        runtime.open_session(registered_avatar, live=False).close()


def test_a_runtime_for_three_sessions_keeps_the_buckets_up_to_the_first_that_holds_a_hop_of_each(engine) -> None:
    with Runtime(engine, RuntimeConfig(sessions=3, progress=False), start=False) as runtime:
        assert runtime.warmup_steps() == [
            ("render frames", 20),
            ("render frames", 10),
            ("render frames", 5),
            ("LMDM windows", 4),
            ("LMDM windows", 2),
            ("LMDM windows", 1),
        ]


@pytest.fixture
def small_gpu(monkeypatch):
    """A device with 3 GiB free (room for one session's graphs, not two), whose start is watched for a warm-up."""
    monkeypatch.setattr(memory, "free_bytes", lambda device: 3 * GIB)
    monkeypatch.setattr(memory, "expandable_segments", lambda: True)
    warmed = []
    monkeypatch.setattr(Runtime, "warm_up", lambda self: warmed.append(self))
    return warmed


def test_a_start_that_cannot_fit_fails_before_warm_up_in_one_line_with_the_need_the_free_and_what_fits(
    engine, small_gpu
) -> None:
    with pytest.raises(OutOfMemoryAtStart) as refused:
        Runtime(engine, RuntimeConfig(sessions=8, progress=False), start=False)
    message = str(refused.value)
    assert "\n" not in message
    assert "a runtime for 8 session(s) needs 7.7 GiB more" in message
    assert "has 3.0 GiB free; 1 fit: ask for sessions=1" in message
    assert small_gpu == []


def test_a_runtime_not_told_its_sessions_is_sized_for_as_many_as_the_memory_holds(engine, small_gpu) -> None:
    with Runtime(engine, RuntimeConfig(progress=False), start=False) as runtime:
        assert runtime.config.sessions == 1 and runtime.config.render_buckets == (5,)

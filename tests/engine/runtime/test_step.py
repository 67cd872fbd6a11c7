"""One tick is one call: a runtime built without its loop thread runs each tick when its caller calls ``step``.

The real HuBERT stand-in, LMDM (2 DDIM steps) and stitching network on random weights; warp+decode is a
black crop (the engine here has no rendering networks), pasted back into the synthetic avatar's frame.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from avatars.cache import Avatar
from bench.common.trace import summary as trace_summary
from engine.engine import Engine
from engine.runtime.config import RuntimeConfig
from engine.runtime.runtime import Runtime

pytestmark = pytest.mark.slow
RATE = 16_000


@pytest.fixture
def runtime(engine: Engine, monkeypatch) -> Runtime:
    monkeypatch.setattr(
        engine.backend, "render", lambda f_s, x_s, x_d: torch.zeros(f_s.shape[0], 3, 8, 8), raising=False
    )
    threads = threading.active_count()
    runtime = Runtime(engine, RuntimeConfig(progress=False), start=False, clock=lambda: 0.0)
    assert threading.active_count() == threads, "no loop thread"
    yield runtime
    runtime.close()


def test_each_step_runs_one_tick_on_the_callers_thread_until_the_session_is_done(
    runtime: Runtime, registered_avatar: Avatar
) -> None:
    assert runtime.step() is False and runtime.counters["ticks"] == 0, "a tick with nothing to do did nothing"
    session = runtime.open_session(registered_avatar, live=False, seed=1)
    assert runtime.metrics()["sessions"] == 1, "opening a session needs no loop thread"
    session.push_audio((0.3 * np.sin(np.arange(4000) / 5)).astype(np.float32), RATE)
    session.end()

    assert runtime.step() is True
    assert runtime.counters["ticks"] == 1 and session.counters["windows"] == 1, (
        "one tick: the audio encoded, its window sampled"
    )
    frames = session.take_ready()
    steps = 1
    while not session.finished and steps < 10:
        assert runtime.step() is True
        frames += session.take_ready()
        steps += 1

    assert session.finished and steps < 10
    assert [f.index for f in frames] == list(range(7)), "every frame of 0.25 s, in order"
    assert all(f.image.shape == (8, 8, 3) and f.image.dtype == torch.uint8 for f in frames), (
        "pasted back into the avatar's frame"
    )
    assert session.stats()["frames_generated"] == 7 and runtime.counters["ticks"] == steps
    assert runtime.metrics()["sessions"] == 0 and len(runtime.avatars) == 0, "a finished session leaves the runtime"
    assert runtime.step() is False


def test_with_a_trace_on_each_tick_is_recorded_with_what_it_launched(
    engine: Engine, registered_avatar: Avatar, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("DITTO_TRACE_DIR", str(tmp_path))
    monkeypatch.setattr(
        engine.backend, "render", lambda f_s, x_s, x_d: torch.zeros(f_s.shape[0], 3, 8, 8), raising=False
    )
    runtime = Runtime(engine, RuntimeConfig(progress=False), start=False, clock=lambda: 0.0)
    try:
        session = runtime.open_session(registered_avatar, live=False, seed=1)
        session.push_audio((0.3 * np.sin(np.arange(4000) / 5)).astype(np.float32), RATE)
        session.end()
        while not session.finished:
            runtime.step()
            session.take_ready()
        ticks, windows = runtime.counters["ticks"], session.counters["windows"]
    finally:
        runtime.close()
    runtime._trace.close()

    profile = trace_summary(tmp_path)["ticks"]
    assert profile["n"] == ticks, "one record a tick that worked"
    rows = profile["rows"]
    assert rows["lmdm"] == [0, windows] and rows["render"] == [0, 7] and rows["hubert"][0] == 0 < rows["hubert"][1], (
        "the stages' rows, all of the job's (not live): its windows, its seven frames, its chunks"
    )
    assert profile["cpu_ms"]["n"] == ticks and "gpu_ms" not in profile, "host times only, on the CPU"

"""A session's audio intake, as pushers on other threads and the runtime's loop share it."""

from __future__ import annotations

import numpy as np
import pytest

import engine.runtime.session as session_module
from engine.runtime.config import RuntimeConfig
from engine.runtime.errors import AudioError
from engine.runtime.session import Session
from engine.timebase import SAMPLE_RATE


def live_session() -> Session:
    return Session(0, "synthetic", True, 75, 0, RuntimeConfig(progress=False), lambda: None)


def tone(seconds: float, rate: int) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 220 * np.arange(round(seconds * rate)) / rate)).astype(np.float32)


def test_a_push_racing_the_loop_draining_the_resamplers_at_speech_end_keeps_every_sample(monkeypatch) -> None:
    session = live_session()
    session.push_audio(tone(0.2, 48_000), 48_000)
    first = session.collect().model.size
    measure = session_module._frames_in
    drained = []

    def loop_drains_meanwhile(pcm, channels):
        drained.append(session.drain_resamplers()[0].size)
        return measure(pcm, channels)

    monkeypatch.setattr(session_module, "_frames_in", loop_drains_meanwhile)
    session.push_audio(tone(0.2, 48_000), 48_000)
    monkeypatch.undo()
    session.end()
    assert drained and first + drained[0] + session.collect().model.size == pytest.approx(0.4 * SAMPLE_RATE, abs=2), (
        "both pushes reach the model, nothing lost"
    )


@pytest.mark.parametrize("rate", ["48000", 0, 44_100.5, float("nan")])
def test_a_sample_rate_that_is_not_a_whole_number_of_hz_is_refused_clearly(rate) -> None:
    with pytest.raises(AudioError, match="sample_rate"):
        live_session().push_audio(tone(0.1, 16_000), rate)


def test_a_session_offers_the_loop_exactly_the_declared_interface() -> None:
    from engine.runtime.loop_side import SessionLoopSide

    declared = {name for name in vars(SessionLoopSide) if not name.startswith("_")} | set(
        SessionLoopSide.__annotations__
    )
    session = live_session()
    assert declared <= set(dir(session)), declared - set(dir(session))
    assert session.room() == RuntimeConfig(progress=False).max_queued_frames and session.last_taken is None

"""Speech segments on a live timeline: every frame carries its segment, numbers never go back, and once a frame
numbered above s is made every frame of segment s has been (what the playback events rely on).

Driven like tests/engine/runtime/test_pipeline_latency.py: the runtime's own step on a virtual clock, instant windows.
"""

from __future__ import annotations

import pytest

from avatars.cache import Avatar
from engine.engine import Engine
from tests.engine.runtime.test_pipeline_latency import VirtualRuntime, utterance

pytestmark = pytest.mark.slow


def test_segments_close_in_order_through_ends_interrupts_and_interrupts_of_nothing(
    engine: Engine, registered_avatar: Avatar
) -> None:
    loop = VirtualRuntime(engine, registered_avatar).open()
    session = loop.session
    loop.run(1.0)
    loop.run(1.6, utterance(0.4), start=1.0)
    assert session.end_segment() == 0
    assert session.end_segment() is None, "nothing pushed since: no segment"
    loop.run(2.0, utterance(0.8), start=1.6)
    loop.pcm = None
    assert session.interrupt() == 1, "barge-in mid-utterance closes segment 1, interrupted"
    assert session.interrupt() is None, "an interrupt of nothing closes nothing"
    loop.run(2.6, utterance(0.4), start=2.1)
    assert session.end_segment() == 2
    loop.run(3.6)
    assert session.closed_segments() == [(0, False), (1, True), (2, False)]
    assert session.closed_segments() == [], "each closure is reported once"

    frames = sorted(loop.segments)
    assert frames == list(range(frames[0], frames[-1] + 1))
    numbers = [loop.segments[i] for i in frames]
    assert numbers == sorted(numbers), "segment numbers never go back along the stream"
    spoken = {s: [i for i in frames if loop.speech[i] and loop.segments[i] == s] for s in (0, 1, 2)}
    assert all(spoken.values()), f"each segment has speech frames: {spoken}"
    for s in (0, 1):
        later = [i for i in frames if loop.segments[i] > s]
        assert max(spoken[s]) < min(later), f"every frame of segment {s} comes before the first numbered above it"
    assert loop.segments[frames[-1]] == 3, "idle after the last close belongs to the next segment"

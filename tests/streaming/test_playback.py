"""Playback events from released frames: started at a segment's first speech frame, finished exactly once per segment,
with the speech shown and whether it was interrupted, whatever the interrupts, repeats and refused sends."""

from __future__ import annotations

import random

import numpy as np

from streaming.output import EncodedFrame
from streaming.playback import PlaybackEvents
from streaming.push_messages import PlaybackFinished, PlaybackStarted


def frame(segment: int, speech: bool, repeat: bool = False) -> EncodedFrame:
    return EncodedFrame(0, 64, 64, b"", False, np.zeros(1920, np.float32), (), speech, repeat, segment)


class Collected:
    def __init__(self, accept: bool = True) -> None:
        self.events: list[dict] = []
        self.accept = accept

    def __call__(self, event: dict) -> bool:
        if self.accept:
            self.events.append(event)
        return self.accept


def test_a_segment_starts_at_its_first_speech_frame_and_finishes_at_the_first_frame_numbered_above_it() -> None:
    events = Collected()
    playback = PlaybackEvents(events)
    for f in [frame(0, False)] * 3 + [frame(0, True)] * 5 + [frame(0, True, repeat=True)] * 4:
        playback.send(f)
    assert events.events == [PlaybackStarted(0)]
    playback.closed([(0, False)])
    playback.send(frame(1, False))
    assert events.events[-1] == PlaybackFinished(0, 0.2, False)
    for f in [frame(1, True)] * 3:
        playback.send(f)
    playback.closed([(1, True), (2, True)])  # 1 cut short, 2 interrupted before any of it was shown
    playback.send(frame(3, False))
    assert events.events[2:] == [
        PlaybackStarted(1),
        PlaybackFinished(1, 0.12, True),
        PlaybackFinished(2, 0.0, True),
    ]
    playback.send(frame(3, True))
    playback.close()
    assert events.events[-1] == PlaybackFinished(3, 0.04, True), (
        "a segment still open when the stream ends is finished then, as interrupted"
    )


def test_events_a_full_queue_refused_are_sent_later_in_order() -> None:
    events = Collected(accept=False)
    playback = PlaybackEvents(events)
    playback.send(frame(0, True))
    playback.closed([(0, False)])
    playback.send(frame(1, False))
    assert playback.stats()["events_waiting"] == 2
    events.accept = True
    playback.send(frame(1, False))
    assert [e.TYPE for e in events.events] == ["playback_started", "playback_finished"]
    assert playback.stats()["events_waiting"] == 0


def test_a_thousand_segments_with_random_interrupts_each_finish_exactly_once() -> None:
    """The engine's order (numbers never go back; every frame of s before any numbered above) with random cuts."""
    rng = random.Random(0)
    events = Collected()
    playback = PlaybackEvents(events)
    interrupted = {}
    for segment in range(1000):
        for _ in range(rng.randrange(3)):
            playback.send(frame(segment, False, repeat=rng.random() < 0.3))
        for _ in range(rng.choice([0, 0, 1, 5, 20])):  # 0: interrupted before any frame of it was made
            playback.send(frame(segment, True, repeat=rng.random() < 0.1))
        interrupted[segment] = rng.random() < 0.5
        playback.closed([(segment, interrupted[segment])])
    playback.send(frame(1000, False))
    finished = [e for e in events.events if isinstance(e, PlaybackFinished)]
    assert [e.segment for e in finished] == list(range(1000))
    assert all(e.interrupted == interrupted[e.segment] for e in finished)
    started = [e.segment for e in events.events if isinstance(e, PlaybackStarted)]
    assert len(started) == len(set(started)), "at most one start per segment"
    playback.close()
    assert len([e for e in events.events if isinstance(e, PlaybackFinished)]) == 1000, "and nothing twice at the end"

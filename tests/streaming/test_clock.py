"""Pacing by pts against one wall-clock anchor: absolute deadlines, no drift, re-anchoring when far behind."""

from __future__ import annotations

import time

import pytest

from streaming.clock import Pacer


def test_deadlines_are_absolute_so_a_slow_step_does_not_shift_the_rest() -> None:
    pacer = Pacer(delay=0.05)
    start = time.monotonic()
    released = []
    for i in range(20):
        pacer.wait(i * 0.01)
        released.append(time.monotonic() - start)
        if i == 5:
            time.sleep(0.03)  # a hiccup: the next items are late, then the schedule holds again
    assert abs(released[0] - 0.05) < 0.015
    assert abs(released[-1] - (0.05 + 0.19)) < 0.015, "no drift accumulated over the run"


def test_far_behind_re_anchors_instead_of_bursting() -> None:
    pacer = Pacer(delay=0.0, resync_after=0.2)
    now = 100.0
    assert pacer.deadline(0.0, now) == pytest.approx(100.0)
    assert pacer.deadline(0.1, now + 0.25) == pytest.approx(100.1), "late, but within resync_after: keep the schedule"
    due = pacer.deadline(0.2, now + 0.6)
    assert pacer.resyncs == 1 and due == pytest.approx(now + 0.6)
    assert pacer.deadline(0.3, now + 0.6) == pytest.approx(now + 0.7), "the new anchor holds for what follows"


def test_with_a_source_clock_items_are_due_delay_after_the_source_shows_them_however_late_they_arrive() -> None:
    pacer = Pacer(delay=0.01)
    assert pacer.deadline(0.0, now=100.3, source=100.0) == pytest.approx(100.01), "no second clock started at arrival"
    assert pacer.deadline(0.2, now=100.0, source=100.0) == pytest.approx(100.21)
    assert pacer.deadline(0.4, now=100.1, source=101.0) == pytest.approx(101.41), "a re-anchored source is followed"
    assert pacer.resyncs == 0


def test_far_behind_a_source_clock_re_anchors_too() -> None:
    pacer = Pacer(delay=0.0, resync_after=0.2)
    assert pacer.deadline(1.0, now=101.5, source=100.0) == pytest.approx(101.5)
    assert pacer.resyncs == 1
    assert pacer.deadline(1.04, now=101.5, source=100.0) == pytest.approx(101.54), (
        "the new anchor holds until the source moves"
    )

"""The output's own clock on a virtual clock: every slot is filled, a late frame is replaced, never a late timeline."""

from __future__ import annotations

import pytest

from streaming.slots import PERIOD, Fill, catch_up, fill, slot_time


def run(arrivals: dict[int, float], slots: int, dues: dict[int, float] | None = None) -> list[tuple[str, int | None]]:
    """Drive the clock from slot 0: frame i arrives at ``arrivals[i]`` and is due at ``dues[i]`` (default i/25)."""
    dues = dues or {i: i * PERIOD for i in arrivals}
    queue: list[int] = []
    out = []
    for slot in range(slots):
        deadline = slot_time(0.0, slot)
        queue += sorted(
            i for i, t in arrivals.items() if t <= deadline and i not in queue and all(i != o for _, o in out)
        )
        for _ in range(catch_up(deadline, [dues[i] for i in queue])):
            out.append(("skip", queue.pop(0)))
        if fill(deadline, dues[queue[0]] if queue else None) is Fill.FRAME:
            out.append(("frame", queue.pop(0)))
        else:
            out.append(("repeat", None))
    return out


def emitted(out: list[tuple[str, int | None]]) -> list[str]:
    return [kind for kind, _ in out if kind != "skip"]


def test_frames_ready_ahead_fill_their_own_slots() -> None:
    out = run({i: i * PERIOD - 0.15 for i in range(20)}, 20)
    assert out == [("frame", i) for i in range(20)]


def test_a_late_frame_is_replaced_and_the_clock_catches_up_once_the_source_is_on_time_again() -> None:
    arrivals = {i: i * PERIOD - 0.15 for i in range(30)}
    arrivals[10] = 10 * PERIOD + 0.01  # ready 10 ms after its deadline
    out = run(arrivals, 30)
    assert len(emitted(out)) == 30, "every slot carries something"
    assert out[10] == ("repeat", None)
    assert ("skip", 10) in out, "one frame is let go to catch up: the stream is on its own clock again"
    assert out[-1] == ("frame", 29), "and ends on time, not a slot behind"


def test_an_overloaded_source_shows_every_frame_it_makes_and_the_timeline_keeps_25_fps() -> None:
    arrivals = {i: i * 2 * PERIOD for i in range(25)}  # half speed: each frame late by i/25 s
    out = run(arrivals, 50)
    assert len(emitted(out)) == 50, "one output frame per slot, whatever the source manages"
    assert [i for kind, i in out if kind == "frame"] == list(range(25)), "nothing is skipped while the source is late"
    assert sum(kind == "repeat" for kind, _ in out) == 25


def test_a_clock_that_restarts_later_holds_the_picture_until_its_frames_are_due() -> None:
    dues = {i: i * PERIOD for i in range(10)} | {i: (i + 5) * PERIOD for i in range(10, 20)}
    out = run({i: dues[i] - 0.1 for i in range(20)}, 25, dues)
    assert out[10:15] == [("repeat", None)] * 5 and out[15] == ("frame", 10)


@pytest.mark.parametrize("phase", [0.3, 0.5, 0.7, -0.3])
def test_a_source_clock_off_the_slot_grid_still_fills_one_slot_per_frame(phase: float) -> None:
    """A session clock 0 < phase < 1/2 slot after the output's grid must not alternate repeat and skip."""
    dues = {i: (i + phase) * PERIOD for i in range(40)}
    out = run({i: dues[i] - 0.15 for i in range(40)}, 40, dues)
    assert sum(kind != "frame" for kind, _ in out[2:]) == 0, out

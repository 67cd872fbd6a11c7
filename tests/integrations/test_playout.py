"""The line a remote bot shows the service's pictures on: the least delay of the recent ones plus a margin, and the
bot's slot deadlines moved onto it."""

from __future__ import annotations

import random

import pytest

from integrations.playout import MAX_MARGIN_S, MIN_MARGIN_S, WINDOW_S, Playout
from streaming.slots import PERIOD

pytest.importorskip("pipecat", reason="integrations.pipecat_video needs pipecat")

from integrations.pipecat_video import PHASE_TOLERANCE_S, phase_step  # noqa: E402


def fed(delays: list[float], start: float = 100.0) -> Playout:
    """A line fed pictures 0, 1, ... ready ``delays[s]`` after their slot on the service's clock (slot 0 at start)."""
    playout = Playout()
    for slot, delay in enumerate(delays):
        playout.ready(slot, start + slot * PERIOD + delay)
    return playout


def test_pictures_are_shown_a_margin_after_the_least_delay_whatever_the_others() -> None:
    rng = random.Random(1)
    delays = [0.300 + rng.choice([0.0, 0.001, 0.002, 0.003]) for _ in range(400)]
    playout = fed(delays)
    assert playout.origin == pytest.approx(100.300 + playout.margin)
    assert MIN_MARGIN_S <= playout.margin <= 0.004, "a steady stream is shown almost as soon as it can be"
    deadline = 100.0 + 450 * PERIOD + 0.300 + playout.margin
    assert playout.slot_at(deadline) == 450 and playout.slot_at(deadline + 0.019) == 450
    assert playout.slot_at(deadline + 0.021) == 451, "the slot nearest the deadline"


def test_the_margin_covers_the_jitter_up_to_its_cap() -> None:
    rng = random.Random(2)
    jittery = fed([0.3 + rng.uniform(0, 0.012) for _ in range(400)])
    assert 0.010 <= jittery.margin <= 0.0125
    stalling = fed([0.3 + (0.2 if slot % 10 == 0 else 0.0) for slot in range(400)])
    assert stalling.margin == MAX_MARGIN_S, "a stall every tenth picture is shown late rather than every picture"


def test_the_line_follows_a_clock_that_drifts_and_forgets_what_is_older_than_its_window() -> None:
    slots = int(3 * WINDOW_S / PERIOD)
    drift = [0.3 + 2e-4 * slot * PERIOD for slot in range(slots)]  # 200 ppm: the two machines' clocks
    playout = fed(drift)
    assert playout.origin == pytest.approx(100.0 + 0.3 + 2e-4 * (slots * PERIOD - WINDOW_S) + playout.margin, abs=5e-4)
    assert Playout().origin is None and Playout().slot_at(5.0) is None


@pytest.mark.parametrize(
    ("start", "phase", "step"),
    [
        (0.0, None, 0.0),
        (0.0, 0.0, 0.0),  # already within the tolerance after the phase
        (0.0, 10.015, 0.015 + PHASE_TOLERANCE_S),
        (0.0, 10.030, -0.010 + PHASE_TOLERANCE_S),  # at most half a slot either way
        (0.003, 0.0, 0.0),
        (0.0055, 0.0, -0.0035),
    ],
)
def test_the_slot_deadlines_move_just_after_the_phase(start: float, phase: float | None, step: float) -> None:
    assert phase_step(start, phase) == pytest.approx(step)

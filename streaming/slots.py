"""The output's own clock: one slot every 1/25 s of wall time, each filled with a frame or a stand-in. Pure functions.

A live stream's timestamps must advance at exactly 25 fps of wall time, whatever the GPU
manages: a broadcast viewer's buffer drains if they fall behind. So the output numbers its
frames by slot, not by the session's frame index. At each slot's deadline the frame whose due
time is nearest that slot is released (the session's clock may sit anywhere between two slots); when none is there the
last picture is repeated, with silence (shed: never a
gap in the timeline, never a late clock). After a repeat the stream is a slot behind the
session; it catches up by skipping one frame as soon as the source is on time again (the
newest queued frame not yet due), never while the source itself is late, so an overloaded
session shows every frame it makes instead of one in five.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from engine.timebase import FPS

PERIOD = 1 / FPS
HALF = PERIOD / 2
EPSILON = 1e-6
"""Seconds of slack at the boundary between two slots, so rounding never flips a frame between them."""


class Fill(Enum):
    """What one slot carries."""

    FRAME = "frame"
    REPEAT = "repeat"


def slot_time(origin: float, slot: int) -> float:
    """Wall time (monotonic) of slot ``slot``'s deadline on a clock whose slot 0 is at ``origin``."""
    return origin + slot * PERIOD


def late(deadline: float, due: float) -> bool:
    """Whether a frame due at ``due`` belongs to a slot before the one at ``deadline`` (each frame goes to the slot
    nearest its due time, so a source clock off the output's grid by a fraction of a slot maps one frame per slot)."""
    return deadline - due > HALF + EPSILON


def catch_up(deadline: float, dues: Sequence[float]) -> int:
    """How many queued frames (their due times ``dues``, oldest first) to skip at a slot whose deadline is ``deadline``:
    those whose slot has passed, while the newest is not late (the source is on time; only the output is behind)."""
    if len(dues) < 2 or late(deadline, dues[-1]):
        return 0
    skip = 0
    while skip < len(dues) - 1 and late(deadline, dues[skip]):
        skip += 1
    return skip


def fill(deadline: float, head_due: float | None) -> Fill:
    """The oldest queued frame when this slot is the nearest to its due time or later, else a repeat of the last
    picture."""
    return Fill.FRAME if head_due is not None and head_due <= deadline + HALF + EPSILON else Fill.REPEAT

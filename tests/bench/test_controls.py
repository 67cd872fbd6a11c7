"""bench.controls: the controls its live sessions switch between every hop are valid and move every field."""

from __future__ import annotations

import random

from bench.controls import every_control
from engine.controls import FIELD_NAMES, Controls


def test_the_benchmarks_controls_are_valid_and_touch_every_kind_of_control() -> None:
    rng = random.Random(0)
    settings = [every_control(rng) for _ in range(20)]
    moved = {name for c in settings for name in c.changed(Controls())}
    assert moved >= set(FIELD_NAMES) - {"blink", "fade_out", "fade_keys"}

"""Both motion sources a runtime session drives implement every member ``MotionSource`` declares."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.motion.conditions import ConditionBuilder
from engine.motion_source import MotionSource
from engine.motion_stream import MotionStream
from engine.offline_motion import PrecomputedMotion

MEMBERS = {name for name in vars(MotionSource) if not name.startswith("_")} | set(MotionSource.__annotations__)


def _stream(overlap: int) -> MotionStream:
    conditions = ConditionBuilder(torch.zeros(63), torch.zeros(2), torch.zeros(6), 1103)
    return MotionStream(conditions, torch.zeros(265), torch.zeros(1024), overlap, torch.zeros(24, 1, 80, 265))


@pytest.mark.parametrize("source", [_stream(10), PrecomputedMotion(torch.zeros(3, 265))], ids=["stream", "precomputed"])
def test_every_declared_member_is_there(source) -> None:
    assert MEMBERS >= {"window_period", "set_window_controls", "take_chunks", "complete", "finish"}
    assert [name for name in sorted(MEMBERS) if not hasattr(source, name)] == []


def test_a_stream_reports_its_window_geometry_and_takes_window_controls() -> None:
    stream = _stream(75)
    assert (stream.window_period, stream.held_frames) == (5, stream.windows.held)
    stream.set_window_controls(3, (0, 202))
    assert (stream.fix_kp_cond, stream.fix_kp_cond_dims) == (3, (0, 202))


def test_precomputed_motion_has_no_windows_and_needs_the_audio_of_its_frames() -> None:
    motion = PrecomputedMotion(torch.zeros(3, 265))
    assert (motion.window_period, motion.held_frames) == (None, 0)
    assert motion.samples_for_frames(2) == 1280 and motion.samples_for_frames(9) == 1920
    motion.push(np.zeros(700, np.float32))
    assert motion.samples_for_frames(2) == 580 and motion.samples_for_frames(1) == 0
    with pytest.raises(RuntimeError, match="samples no windows"):
        motion.complete(torch.zeros(80, 265))

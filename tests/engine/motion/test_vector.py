"""The 265-d motion vector: [scale-1 | pitch 66 | yaw 66 | roll 66 | t 3 | exp 63], kp not included."""

from __future__ import annotations

import pytest
import torch

from engine.motion.vector import MOTION_DIM, MOTION_SLICES, join_motion, split_motion


def test_layout_widths_sum_to_265() -> None:
    widths = {k: s.stop - s.start for k, s in MOTION_SLICES.items()}
    assert widths == {"scale": 1, "pitch": 66, "yaw": 66, "roll": 66, "t": 3, "exp": 63}
    assert sum(widths.values()) == MOTION_DIM == 265


def test_split_restores_scale_and_slices_in_order() -> None:
    vector = torch.arange(2 * 265, dtype=torch.float32).reshape(2, 265)
    parts = split_motion(vector)
    assert parts["scale"].tolist() == [[1.0], [266.0]], "scale is stored as scale-1"
    assert parts["pitch"][0, 0] == 1 and parts["yaw"][0, 0] == 67 and parts["roll"][0, 0] == 133
    assert parts["t"][0].tolist() == [199, 200, 201] and parts["exp"][0, -1] == 264


def test_join_inverts_split_and_ignores_kp() -> None:
    vector = torch.randn(3, 265, generator=torch.Generator().manual_seed(0))
    parts = split_motion(vector) | {"kp": torch.zeros(3, 63)}
    torch.testing.assert_close(join_motion(parts), vector)


def test_bad_shapes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="265"):
        split_motion(torch.zeros(2, 264))
    with pytest.raises(ValueError, match="lack"):
        join_motion({"scale": torch.zeros(1)})
    parts = split_motion(torch.zeros(1, 265))
    parts["t"] = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="'t'"):
        join_motion(parts)

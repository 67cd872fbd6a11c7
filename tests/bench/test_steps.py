"""bench.steps' measure of motion: the correlation over time of keypoint tracks."""

from __future__ import annotations

import numpy as np
import pytest

from bench.steps import keypoint_correlation


def test_keypoint_correlation_follows_motion_not_offset_or_scale() -> None:
    rng = np.random.default_rng(1)
    track = rng.standard_normal((30, 21, 3))
    assert keypoint_correlation(track, 2 * track + 5) == pytest.approx(1.0)
    assert keypoint_correlation(track, -track) == pytest.approx(-1.0)
    assert abs(keypoint_correlation(track, rng.standard_normal((30, 21, 3)))) < 0.2


def test_keypoint_correlation_needs_two_matching_moving_tracks() -> None:
    with pytest.raises(ValueError, match="same shape"):
        keypoint_correlation(np.zeros((3, 21, 3)), np.zeros((4, 21, 3)))
    with pytest.raises(ValueError, match="moves"):
        keypoint_correlation(np.ones((3, 21, 3)), np.ones((3, 21, 3)))

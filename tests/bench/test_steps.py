"""bench.steps' two measures: frame PSNR and the correlation over time of keypoint tracks."""

from __future__ import annotations

import numpy as np
import pytest

from bench.steps import keypoint_correlation, psnr


def test_psnr_is_infinite_for_equal_frames_and_20_db_for_an_rms_error_of_a_tenth_of_full_scale() -> None:
    frame = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    assert psnr(frame, frame) == float("inf")
    assert psnr(np.zeros((4, 4), np.uint8), np.full((4, 4), 25.5)) == pytest.approx(20.0)


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

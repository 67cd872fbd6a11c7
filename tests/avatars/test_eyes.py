"""Eye openness and eye-ball offsets from 478 face-mesh landmarks."""

from __future__ import annotations

import numpy as np
import pytest

from avatars.eyes import eye_features


def eyes_478(left_gap: float, right_gap: float, left_iris=(0.0, 0.0, 0.0), right_iris=(0.0, 0.0, 0.0)) -> np.ndarray:
    """Two horizontal eyes 0.1 wide; lids ``gap`` apart at three places; iris offset from the eye centre."""
    lmk = np.zeros((478, 3))
    for (outer, inner), lids, iris, centre_x, gap, offset in (
        ((33, 133), ((145, 159), (144, 160), (153, 158)), 468, 0.35, left_gap, left_iris),
        ((263, 362), ((374, 386), (373, 387), (380, 385)), 473, 0.65, right_gap, right_iris),
    ):
        sign = -1 if outer == 33 else 1  # outer corners point away from the nose
        lmk[outer] = (centre_x + sign * 0.05, 0.4, 0)
        lmk[inner] = (centre_x - sign * 0.05, 0.4, 0)
        for lower, upper in lids:
            lmk[lower] = (centre_x, 0.4 + gap / 2, 0)
            lmk[upper] = (centre_x, 0.4 - gap / 2, 0)
        lmk[iris] = np.array([centre_x, 0.4, 0]) + offset
    return lmk


def test_openness_is_three_lid_gaps_over_the_eye_width() -> None:
    eye_open, _ = eye_features(eyes_478(0.02, 0.04))
    assert eye_open.shape == (1, 2) and eye_open.dtype == np.float32
    assert eye_open[0] == pytest.approx([3 * 0.02 / 0.1, 3 * 0.04 / 0.1], rel=1e-6)


def test_a_centred_iris_gives_zero_ball_offset() -> None:
    _, eye_ball = eye_features(eyes_478(0.03, 0.03))
    assert eye_ball.shape == (1, 6)
    assert np.allclose(eye_ball, 0, atol=1e-6)


def test_ball_offset_is_iris_direction_minus_eye_axis_times_distance_in_lx_rx_ly_ry_lz_rz_order() -> None:
    d = 0.01
    _, eye_ball = eye_features(eyes_478(0.03, 0.03, left_iris=(0, -d, 0), right_iris=(0, 0, d)))
    # left eye: axis (inner->outer) = (-1,0,0), iris up: ((0,-1,0) - (-1,0,0)) * d
    left = np.array([1.0, -1.0, 0.0]) * d
    # right eye: axis = (+1,0,0), iris forward in z: ((0,0,1) - (1,0,0)) * d
    right = np.array([-1.0, 0.0, 1.0]) * d
    expected = np.stack([left, right], axis=-1).reshape(6)  # [Lx, Rx, Ly, Ry, Lz, Rz]
    assert eye_ball[0] == pytest.approx(expected, abs=1e-7)


def test_batches_and_bad_shapes() -> None:
    batch = np.stack([eyes_478(0.01, 0.01), eyes_478(0.02, 0.02)])
    eye_open, eye_ball = eye_features(batch)
    assert eye_open.shape == (2, 2) and eye_ball.shape == (2, 6)
    assert eye_open[1, 0] == pytest.approx(2 * eye_open[0, 0])
    with pytest.raises(ValueError, match="478"):
        eye_features(np.zeros((468, 3)))

"""The 512 crop: roll alignment, size and offset, and its inverse transform."""

from __future__ import annotations

import math

import numpy as np
import pytest

from avatars.crop import AVATAR_CROP, CropSpec, anchors, crop_matrix, face_rect, invert, transform_points


def upright_face_203(centre=(300.0, 200.0), half_width=50.0) -> np.ndarray:
    """Synthetic 203-point landmarks of an upright face: eyes level, lip below, extent a known box."""
    rng = np.random.default_rng(0)
    cx, cy = centre
    pts = np.column_stack([rng.uniform(cx - half_width, cx + half_width, 203), rng.uniform(cy - 60, cy + 60, 203)])
    pts[[0, 6, 12, 18]] = (cx - 25, cy - 20)
    pts[[24, 30, 36, 42]] = (cx + 25, cy - 20)
    pts[[48, 66]] = (cx, cy + 35)
    pts[[1, 2]] = (cx - half_width, cy - 60), (cx + half_width, cy + 60)  # the extent's corners
    return pts


def rotate(points: np.ndarray, angle: float, about: np.ndarray) -> np.ndarray:
    """Rotate points by ``angle`` (radians, clockwise on screen: image y points down)."""
    c, s = math.cos(angle), math.sin(angle)
    return (points - about) @ np.array([[c, s], [-s, c]]) + about


def test_inverse_transform_round_trips_points_and_matrices() -> None:
    m_o2c = crop_matrix(rotate(upright_face_203(), 0.3, np.array([300.0, 200.0])))
    m_c2o = invert(m_o2c)
    assert np.allclose(m_c2o @ m_o2c, np.eye(3), atol=1e-12)
    assert np.allclose(m_o2c[2], [0, 0, 1]) and np.allclose(m_c2o[2], [0, 0, 1])
    pts = np.random.default_rng(1).uniform(0, 512, (50, 2))
    assert np.allclose(transform_points(transform_points(pts, m_c2o), m_o2c), pts, atol=1e-9)


@pytest.mark.parametrize("degrees", [-35.0, -10.0, 0.0, 12.5, 40.0])
def test_a_rotated_face_gives_its_roll_angle_and_comes_out_upright(degrees: float) -> None:
    face = upright_face_203()
    centre = np.array([300.0, 200.0])
    tilted = rotate(face, math.radians(degrees), centre)
    _, _, angle = face_rect(tilted)
    assert math.degrees(angle) == pytest.approx(degrees, abs=1e-9)

    in_crop = transform_points(tilted, crop_matrix(tilted))
    left_eye, right_eye, lip = in_crop[0], in_crop[24], in_crop[48]
    assert left_eye[1] == pytest.approx(right_eye[1], abs=1e-9)  # eyes level
    assert lip[1] > left_eye[1]  # lip below the eyes
    assert (left_eye[0] + right_eye[0]) / 2 == pytest.approx(256.0, abs=1e-6)  # centred horizontally


def test_the_crop_side_is_scale_times_the_landmark_extent_and_vy_moves_it_up() -> None:
    face = upright_face_203(half_width=50.0)  # extent 100 wide, 120 high -> square side 120
    centre, side, _ = face_rect(face, AVATAR_CROP)
    assert side == pytest.approx(120 * 2.3)
    assert centre[0] == pytest.approx(300.0)
    assert centre[1] == pytest.approx(200.0 - 0.125 * side)  # negative vy: above the box centre
    no_offset, _, _ = face_rect(face, CropSpec(vy_ratio=0.0))
    assert no_offset[1] == pytest.approx(200.0)
    scale = crop_matrix(face)[0, 0]
    assert scale == pytest.approx(512 / side)


def test_without_rotation_the_crop_stays_axis_aligned() -> None:
    tilted = rotate(upright_face_203(), math.radians(20), np.array([300.0, 200.0]))
    m = crop_matrix(tilted, CropSpec(rotate=False))
    assert m[0, 1] == 0 and m[1, 0] == 0


def test_facemesh_landmarks_use_their_eye_and_lip_points() -> None:
    mesh = np.zeros((478, 3))
    mesh[:, :2] = (100, 100)
    mesh[[33, 133, 159, 145], :2] = (80, 90)
    mesh[[263, 362, 386, 374], :2] = (120, 90)
    mesh[[13, 14], :2] = (100, 130)
    eye_mid, lip, extent = anchors(mesh)
    assert np.allclose(eye_mid, (100, 90)) and np.allclose(lip, (100, 130))
    assert len(extent) < 478  # forehead points left out


def test_unknown_landmark_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="106, 203, 468 or 478"):
        anchors(np.zeros((68, 2)))

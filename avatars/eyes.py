"""Eye conditions for the motion diffusion: eye openness (2) and eye-ball offset (6) from 478 landmarks.

Landmarks are MediaPipe's normalized face-mesh points on the 512 crop (x, y in [0,1], z in the
same scale). Openness per eye is the sum of three lid distances over the eye width; the ball
offset is the iris's direction from the eye centre minus the eye's own axis, times the iris
distance. Order: eye_open [L, R]; eye_ball [Lx, Rx, Ly, Ry, Lz, Rz].
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-8
# (outer corner, inner corner), three (lower, upper) lid pairs, iris centre; per eye.
_LEFT = ((33, 133), ((145, 159), (144, 160), (153, 158)), 468)
_RIGHT = ((263, 362), ((374, 386), (373, 387), (380, 385)), 473)


def _one_eye(lmk: np.ndarray, spec: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Openness (n,) and ball offset (n,3) of one eye for landmarks (n,478,3)."""
    (outer, inner), lids, iris = spec
    width = np.linalg.norm(lmk[:, outer] - lmk[:, inner], axis=-1)
    opening = sum(np.linalg.norm(lmk[:, lo] - lmk[:, up], axis=-1) for lo, up in lids) / (width + _EPS)
    centre = (lmk[:, outer] + lmk[:, inner]) / 2
    ball = lmk[:, iris] - centre
    ball_len = np.linalg.norm(ball, axis=-1, keepdims=True)
    axis = (lmk[:, outer] - lmk[:, inner]) / (width[:, None] + _EPS)
    move = (ball / (ball_len + _EPS) - axis) * ball_len
    return opening, move


def eye_features(landmarks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """eye_open (n,2) and eye_ball (n,6) float32 from landmarks (478,3) or (n,478,3)."""
    lmk = np.asarray(landmarks, dtype=np.float64)
    if lmk.ndim == 2:
        lmk = lmk[None]
    if lmk.ndim != 3 or lmk.shape[1] != 478 or lmk.shape[2] != 3:
        raise ValueError(f"eye features need (n,478,3) face-mesh landmarks with iris points, got {lmk.shape}")
    left_open, left_move = _one_eye(lmk, _LEFT)
    right_open, right_move = _one_eye(lmk, _RIGHT)
    eye_open = np.stack([left_open, right_open], axis=-1)
    eye_ball = np.stack([left_move, right_move], axis=-1).reshape(-1, 6)
    return eye_open.astype(np.float32), eye_ball.astype(np.float32)

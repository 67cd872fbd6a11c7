"""The roll-aligned square crop around a face, as similarity transforms (pure numpy).

The crop's vertical axis runs from the eyes' midpoint to the lip centre, so a tilted head comes
out upright; its side is ``scale`` times the larger extent of the landmarks in that frame, and
its centre moves by ``vy_ratio`` of the side along that axis (negative: up, to keep the
forehead). ``M_o2c`` maps original-image pixels to crop pixels, ``M_c2o`` maps back; both are
3x3 with last row (0, 0, 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

# Anchor indices per landmark scheme: (left-eye points, right-eye points, lip pair).
_EYES_LIP_203 = ([0, 6, 12, 18], [24, 30, 36, 42], [48, 66])
_EYES_LIP_106 = ([33, 35, 40, 39], [87, 89, 94, 93], [52, 61])
_EYES_LIP_MESH = ([33, 133, 159, 145], [263, 362, 386, 374], [13, 14])

# FaceMesh points spanning what the 106/203 schemes span (jaw line temple to temple, brows,
# eyes, nose, lips), so the forehead points of the mesh do not inflate the crop.
_MESH_EXTENT = (
    [127, 234, 93, 132, 58, 172, 136, 150, 149, 176, 148, 152, 377, 400, 378, 379, 365, 397, 288, 361, 323, 454, 356]
    + [46, 53, 52, 65, 55, 70, 63, 105, 66, 107, 276, 283, 282, 295, 285, 300, 293, 334, 296, 336]
    + [33, 133, 159, 145, 263, 362, 386, 374, 1, 4, 98, 327, 61, 291, 0, 17, 13, 14]
)


@dataclass(frozen=True)
class CropSpec:
    """Output side in pixels, face-extent multiplier, vertical offset (fraction of the side), roll alignment."""

    dsize: int = 512
    scale: float = 2.3
    vy_ratio: float = -0.125
    rotate: bool = True

    def as_dict(self) -> dict[str, float | int | bool]:
        """Plain values for the cache manifest."""
        return asdict(self)


AVATAR_CROP = CropSpec()
LANDMARK_CROP = CropSpec(dsize=224, scale=1.5, vy_ratio=-0.1, rotate=True)


def anchors(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(eye midpoint, lip centre, extent points) of 106-, 203- or 468/478-point landmarks in pixels."""
    pts = np.asarray(points, dtype=np.float64)[:, :2]
    count = pts.shape[0]
    if count == 203:
        (left, right, lip), extent = _EYES_LIP_203, pts
    elif count == 106:
        (left, right, lip), extent = _EYES_LIP_106, pts
    elif count in (468, 478):
        (left, right, lip), extent = _EYES_LIP_MESH, pts[_MESH_EXTENT]
    else:
        raise ValueError(f"landmarks must have 106, 203, 468 or 478 points, got {count}")
    eye_mid = (pts[left].mean(axis=0) + pts[right].mean(axis=0)) / 2
    return eye_mid, pts[lip].mean(axis=0), extent


def face_rect(points: np.ndarray, spec: CropSpec = AVATAR_CROP) -> tuple[np.ndarray, float, float]:
    """Centre (x, y), side length and roll angle (radians, clockwise in image coordinates) of the crop."""
    eye_mid, lip, extent = anchors(points)
    uy = lip - eye_mid
    length = float(np.linalg.norm(uy))
    uy = uy / length if length > 1e-3 else np.array([0.0, 1.0])
    ux = np.array([uy[1], -uy[0]])
    angle = math.atan2(ux[1], ux[0])
    axes = np.stack([ux, uy])
    origin = extent.mean(axis=0)
    local = (extent - origin) @ axes.T
    low, high = local.min(axis=0), local.max(axis=0)
    side = float((high - low).max()) * spec.scale
    centre = origin + ((low + high) / 2) @ axes + uy * (spec.vy_ratio * side)
    return centre, side, angle


def crop_matrix(points: np.ndarray, spec: CropSpec = AVATAR_CROP) -> np.ndarray:
    """M_o2c (3x3 float64): original pixels -> crop pixels for the face given by ``points``."""
    centre, side, angle = face_rect(points, spec)
    s = spec.dsize / side
    cos, sin = (math.cos(angle), math.sin(angle)) if spec.rotate else (1.0, 0.0)
    half = spec.dsize / 2
    cx, cy = centre
    return np.array(
        [
            [s * cos, s * sin, half - s * (cos * cx + sin * cy)],
            [-s * sin, s * cos, half - s * (-sin * cx + cos * cy)],
            [0.0, 0.0, 1.0],
        ]
    )


def invert(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a 3x3 affine transform (M_o2c -> M_c2o and back)."""
    return np.linalg.inv(np.asarray(matrix, dtype=np.float64))


def transform_points(points: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Apply the affine part of ``matrix`` (2x3 or 3x3) to (N,2) points."""
    m = np.asarray(matrix, dtype=np.float64)
    return np.asarray(points, dtype=np.float64)[:, :2] @ m[:2, :2].T + m[:2, 2]

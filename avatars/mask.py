"""The feathered paste-back mask of the 512 crop: 1 inside, linear ramps at the edges, round corners.

The central ``ratio`` of each side is 1; each border strip ramps linearly from 0 at the image
edge to 1 at the interior (``linspace`` over the strip); each corner square holds a quarter
disc, 1 - min(1, distance to the interior corner in strip units).
"""

from __future__ import annotations

import numpy as np


def _split(size: int, ratio: float) -> tuple[int, int]:
    """(first border width, interior length) of one axis."""
    inner = int(size * ratio)
    return (size - inner) // 2, inner


def feathered_mask(height: int = 512, width: int = 512, ratio_h: float = 0.9, ratio_w: float = 0.9) -> np.ndarray:
    """(height, width) float32 mask for blending the rendered crop back into the frame."""
    top, inner_h = _split(height, ratio_h)
    left, inner_w = _split(width, ratio_w)
    bottom, right = height - top - inner_h, width - left - inner_w
    # Per axis: 0 at the outer edge rising to 1 at the interior (reversed for the far side), 1 inside.
    ys = np.concatenate([np.linspace(0, 1, top), np.ones(inner_h), np.linspace(1, 0, bottom)])
    xs = np.concatenate([np.linspace(0, 1, left), np.ones(inner_w), np.linspace(1, 0, right)])
    in_y = np.zeros(height, bool)
    in_y[top : top + inner_h] = True
    in_x = np.zeros(width, bool)
    in_x[left : left + inner_w] = True
    mask = np.minimum.outer(ys, xs)
    corner = ~in_y[:, None] & ~in_x[None, :]
    dist = np.hypot(1 - ys[:, None], 1 - xs[None, :])
    mask[corner] = (1 - np.clip(dist, 0, 1))[corner]
    return mask.astype(np.float32)

"""The LMDM's 265-d motion vector and its named parts.

Layout: ``[scale-1 (1) | pitch logits (66) | yaw logits (66) | roll logits (66) | t (3) | exp (63)]``.
The canonical keypoints ``kp`` are not part of it; they always come from the avatar.
"""

from __future__ import annotations

import numpy as np
import torch

MOTION_DIM = 265
POSE_BINS = 66
NUM_KEYPOINTS = 21
SMOOTHED_DIMS = 202
"""Dims [0:202] (scale, pose logits, t) are smoothed across windows; the expression is not."""

MOTION_SLICES: dict[str, slice] = {
    "scale": slice(0, 1),
    "pitch": slice(1, 67),
    "yaw": slice(67, 133),
    "roll": slice(133, 199),
    "t": slice(199, 202),
    "exp": slice(202, 265),
}
MOTION_KEYS = tuple(MOTION_SLICES)


def split_motion(vector: torch.Tensor) -> dict[str, torch.Tensor]:
    """Motion vectors (..., 265) -> named parts (..., width); ``scale`` gets its +1 back."""
    if vector.shape[-1] != MOTION_DIM:
        raise ValueError(
            f"motion vectors must have {MOTION_DIM} values in the last axis, got shape {tuple(vector.shape)}"
        )
    parts = {key: vector[..., part] for key, part in MOTION_SLICES.items()}
    parts["scale"] = parts["scale"] + 1
    return parts


def join_motion(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """Named parts (..., width) -> motion vectors (..., 265), storing ``scale`` as scale-1; extra keys (kp) are
    ignored."""
    missing = [key for key in MOTION_KEYS if key not in parts]
    if missing:
        raise ValueError(f"motion parts lack {missing}; need {list(MOTION_KEYS)}")
    pieces = []
    for key, part in MOTION_SLICES.items():
        value = parts[key]
        width = part.stop - part.start
        if value.shape[-1] != width:
            raise ValueError(
                f"motion part {key!r} must have {width} values in the last axis, got shape {tuple(value.shape)}"
            )
        pieces.append(value - 1 if key == "scale" else value)
    return torch.cat(_broadcast_leading(pieces), dim=-1)


def _broadcast_leading(pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Broadcast all leading axes (not the last) to a common shape so the parts can be concatenated."""
    lead = np.broadcast_shapes(
        *(tuple(p.shape[:-1]) for p in pieces)
    )  # torch's imports sympy (0.5 s) at its first call
    return [p.expand(*lead, p.shape[-1]) for p in pieces]

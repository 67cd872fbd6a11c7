"""Implicit keypoints posed by a motion: kp_t = scale·(kp @ R + exp) + (t_x, t_y, 0), batched over frames."""

from __future__ import annotations

import torch

from engine.motion.pose import bins_to_degrees, rotation_matrix
from engine.motion.vector import NUM_KEYPOINTS


def transform_keypoints(
    kp: torch.Tensor,
    rotation: torch.Tensor,
    exp: torch.Tensor,
    scale: torch.Tensor,
    t: torch.Tensor,
) -> torch.Tensor:
    """Canonical kp (B,63)|(B,21,3), R (B,3,3), exp (B,63), scale (B,1), t (B,3) -> posed keypoints (B,21,3); t_z is
    ignored."""
    kp = _as_points(kp, "kp")
    exp = _as_points(exp, "exp")
    posed = (kp @ rotation + exp) * scale.reshape(-1, 1, 1)
    shift = torch.cat([t[..., :2], torch.zeros_like(t[..., 2:3])], dim=-1)
    return posed + shift.reshape(-1, 1, 3)


def motion_keypoints(motion: dict[str, torch.Tensor], kp: torch.Tensor) -> torch.Tensor:
    """Named motion parts (pose logits (B,66), t, exp, scale) applied to canonical kp -> (B,21,3)."""
    rotation = rotation_matrix(
        bins_to_degrees(motion["pitch"]), bins_to_degrees(motion["yaw"]), bins_to_degrees(motion["roll"])
    )
    return transform_keypoints(kp, rotation, motion["exp"], motion["scale"], motion["t"])


def _as_points(values: torch.Tensor, name: str) -> torch.Tensor:
    """(B,63) or (B,21,3) -> (B,21,3), with a clear error for anything else."""
    if values.shape[-1] == 3 * NUM_KEYPOINTS:
        return values.unflatten(-1, (NUM_KEYPOINTS, 3))
    if values.shape[-2:] == (NUM_KEYPOINTS, 3):
        return values
    raise ValueError(
        f"{name} must be (B,{3 * NUM_KEYPOINTS}) or (B,{NUM_KEYPOINTS},3), got shape {tuple(values.shape)}"
    )

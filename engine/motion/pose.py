"""Head pose: 66-bin logits -> degrees (softmax expectation) -> rotation matrices."""

from __future__ import annotations

import math

import torch

from engine.motion.vector import POSE_BINS

BIN_DEGREES = 3.0
BIN_OFFSET_DEGREES = 97.5


def bins_to_degrees(logits: torch.Tensor) -> torch.Tensor:
    """Pose logits (..., 66) -> angle in degrees (...): 3·Σ softmax(logits)_i·i − 97.5, range [−97.5, 97.5]."""
    if logits.shape[-1] != POSE_BINS:
        raise ValueError(f"pose logits must have {POSE_BINS} bins in the last axis, got shape {tuple(logits.shape)}")
    bins = torch.arange(POSE_BINS, device=logits.device, dtype=logits.dtype)
    expectation = (torch.softmax(logits, dim=-1) * bins).sum(dim=-1)
    return expectation * BIN_DEGREES - BIN_OFFSET_DEGREES


def rotation_matrix(pitch: torch.Tensor, yaw: torch.Tensor, roll: torch.Tensor) -> torch.Tensor:
    """Angles in degrees (...) -> R = (Rz(roll)·Ry(yaw)·Rx(pitch))ᵀ (..., 3, 3), the row-vector form kp @ R uses."""
    pitch, yaw, roll = torch.broadcast_tensors(pitch, yaw, roll)
    to_rad = math.pi / 180.0
    cx, sx = torch.cos(pitch * to_rad), torch.sin(pitch * to_rad)
    cy, sy = torch.cos(yaw * to_rad), torch.sin(yaw * to_rad)
    cz, sz = torch.cos(roll * to_rad), torch.sin(roll * to_rad)
    one, zero = torch.ones_like(cx), torch.zeros_like(cx)
    rot_x = _matrix(one, zero, zero, zero, cx, -sx, zero, sx, cx)
    rot_y = _matrix(cy, zero, sy, zero, one, zero, -sy, zero, cy)
    rot_z = _matrix(cz, -sz, zero, sz, cz, zero, zero, zero, one)
    return (rot_z @ rot_y @ rot_x).transpose(-1, -2)


def _matrix(*entries: torch.Tensor) -> torch.Tensor:
    """Nine same-shaped tensors (...) in row-major order -> matrices (..., 3, 3)."""
    return torch.stack(entries, dim=-1).unflatten(-1, (3, 3))

"""transform_keypoints, batched, equals a per-frame transcription of kp_t = s·(kp·R + exp) + (tx, ty, 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.motion.keypoints import motion_keypoints, transform_keypoints
from engine.motion.pose import rotation_matrix


def _frame_reference(kp, pitch, yaw, roll, t, exp, scale):
    def degrees(logits):
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return float((p * np.arange(66)).sum() * 3 - 97.5)

    x, y, z = (math.radians(degrees(v)) for v in (pitch, yaw, roll))
    rx = np.array([[1, 0, 0], [0, math.cos(x), -math.sin(x)], [0, math.sin(x), math.cos(x)]])
    ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    rz = np.array([[math.cos(z), -math.sin(z), 0], [math.sin(z), math.cos(z), 0], [0, 0, 1]])
    posed = (kp.reshape(21, 3) @ (rz @ ry @ rx).T + exp.reshape(21, 3)) * scale[0]
    posed[:, :2] += t[:2]
    return posed


def test_batched_transform_equals_the_per_frame_transcription() -> None:
    g = torch.Generator().manual_seed(0)
    b = 5
    motion = {
        "pitch": torch.randn(b, 66, generator=g),
        "yaw": torch.randn(b, 66, generator=g),
        "roll": torch.randn(b, 66, generator=g),
        "t": torch.randn(b, 3, generator=g),
        "exp": torch.randn(b, 63, generator=g) * 0.05,
        "scale": 1 + torch.rand(b, 1, generator=g),
    }
    kp = torch.randn(b, 63, generator=g) * 0.3
    ours = motion_keypoints(motion, kp)
    assert ours.shape == (b, 21, 3)
    for i in range(b):
        ref = _frame_reference(
            *(
                v[i].double().numpy()
                for v in (
                    kp,
                    motion["pitch"],
                    motion["yaw"],
                    motion["roll"],
                    motion["t"],
                    motion["exp"],
                    motion["scale"],
                )
            )
        )
        np.testing.assert_allclose(ours[i].numpy(), ref, atol=1e-5)


def test_translation_z_is_ignored_and_one_kp_broadcasts_over_frames() -> None:
    kp = torch.randn(1, 21, 3, generator=torch.Generator().manual_seed(1))
    rotation = rotation_matrix(torch.zeros(2), torch.zeros(2), torch.zeros(2))
    t = torch.tensor([[1.0, 2.0, 100.0], [0.0, 0.0, -5.0]])
    out = transform_keypoints(kp, rotation, torch.zeros(2, 63), torch.ones(2, 1), t)
    torch.testing.assert_close(out[0], kp[0] + torch.tensor([1.0, 2.0, 0.0]))
    torch.testing.assert_close(out[1], kp[0])


def test_bad_keypoint_shape_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="kp must be"):
        transform_keypoints(
            torch.zeros(1, 60), torch.eye(3)[None], torch.zeros(1, 63), torch.ones(1, 1), torch.zeros(1, 3)
        )

"""Head pose: 66 bins -> degrees by softmax expectation; R = (Rz·Ry·Rx)ᵀ."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.motion.pose import bins_to_degrees, rotation_matrix


def _peaked(bin_index: int) -> torch.Tensor:
    logits = torch.full((66,), -1e4)
    logits[bin_index] = 0.0
    return logits


def test_bin_edges_and_centre() -> None:
    assert bins_to_degrees(_peaked(0)).item() == pytest.approx(-97.5)
    assert bins_to_degrees(_peaked(65)).item() == pytest.approx(97.5)
    assert bins_to_degrees(torch.zeros(66)).item() == pytest.approx(0.0, abs=1e-5), "uniform logits give the centre"
    assert bins_to_degrees(_peaked(33)).item() == pytest.approx(1.5)


def test_bins_are_a_softmax_expectation_batched() -> None:
    logits = torch.randn(4, 66, generator=torch.Generator().manual_seed(0))
    p = torch.softmax(logits.double(), -1)
    expected = (p * torch.arange(66)).sum(-1) * 3 - 97.5
    torch.testing.assert_close(bins_to_degrees(logits), expected.float(), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="66"):
        bins_to_degrees(torch.zeros(3, 65))


def test_rotations_are_orthonormal_with_unit_determinant() -> None:
    angles = torch.randn(3, 16, generator=torch.Generator().manual_seed(1)) * 60
    rot = rotation_matrix(*angles).double()
    torch.testing.assert_close(
        rot @ rot.transpose(-1, -2), torch.eye(3, dtype=torch.float64).expand(16, 3, 3), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(torch.linalg.det(rot), torch.ones(16, dtype=torch.float64), atol=1e-6, rtol=0)


def test_known_quarter_turns() -> None:
    zero, ninety = torch.tensor(0.0), torch.tensor(90.0)
    yaw = rotation_matrix(zero, ninety, zero)
    pitch = rotation_matrix(ninety, zero, zero)
    roll = rotation_matrix(zero, zero, ninety)
    torch.testing.assert_close(yaw, torch.tensor([[0.0, 0, -1], [0, 1, 0], [1, 0, 0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(pitch, torch.tensor([[1.0, 0, 0], [0, 0, 1], [0, -1, 0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(roll, torch.tensor([[0.0, 1, 0], [-1, 0, 0], [0, 0, 1]]), atol=1e-6, rtol=0)


def test_composition_order_is_z_y_x_transposed() -> None:
    p, y, r = (math.radians(a) for a in (10.0, -25.0, 40.0))
    rx = np.array([[1, 0, 0], [0, math.cos(p), -math.sin(p)], [0, math.sin(p), math.cos(p)]])
    ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    rz = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1]])
    ours = rotation_matrix(torch.tensor(10.0), torch.tensor(-25.0), torch.tensor(40.0))
    np.testing.assert_allclose(ours.numpy(), (rz @ ry @ rx).T, atol=1e-6)

"""The feathered paste-back mask: interior 1, linear ramps over the border strips, quarter-disc corners."""

from __future__ import annotations

import numpy as np

from avatars.mask import feathered_mask


def test_the_512_mask_has_a_460_px_interior_of_ones() -> None:
    mask = feathered_mask(512, 512)
    assert mask.shape == (512, 512) and mask.dtype == np.float32
    assert np.all(mask[26:486, 26:486] == 1)
    assert mask[25, 256] == 1 and mask[24, 256] < 1  # the ramp's last row reaches 1


def test_border_strips_ramp_linearly_from_zero_at_the_edge() -> None:
    mask = feathered_mask(512, 512)
    ramp = np.linspace(0, 1, 26)
    assert np.allclose(mask[:26, 256], ramp, atol=1e-6)  # top
    assert np.allclose(mask[486:, 256], ramp[::-1], atol=1e-6)  # bottom
    assert np.allclose(mask[256, :26], ramp, atol=1e-6)  # left
    assert np.allclose(mask[256, 486:], ramp[::-1], atol=1e-6)  # right
    assert np.all(mask[:26, 26:486] == mask[:26, 256:257])  # constant along the strip


def test_corners_are_quarter_discs_around_the_interior_corner() -> None:
    mask = feathered_mask(512, 512)
    assert mask[0, 0] == 0 and mask[25, 25] == 1
    for i, j in [(20, 25), (25, 10), (15, 15), (5, 20)]:
        distance = np.hypot((25 - i) / 25, (25 - j) / 25)
        assert mask[i, j] == np.float32(1 - min(distance, 1.0))
    assert mask[5, 5] == 0  # outside the disc of radius 25 px
    assert np.array_equal(mask, mask[::-1]) and np.array_equal(mask, mask[:, ::-1])


def test_other_sizes_keep_the_ratio() -> None:
    mask = feathered_mask(100, 200, 0.8, 0.5)
    assert mask.shape == (100, 200)
    rows, cols = np.nonzero(mask == 1)
    assert (rows.min(), rows.max()) == (9, 90) and (cols.min(), cols.max()) == (49, 150)

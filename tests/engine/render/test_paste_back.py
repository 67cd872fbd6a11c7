"""On-device paste-back equals cv2.warpAffine (INTER_LINEAR, constant 0) of render and mask plus Ditto's blend."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.render.paste_back import PasteBack, feather_mask

cv2 = pytest.importorskip("cv2")

H, W = 120, 150


def reference_mask(size: int = 512, margin: int = 26) -> np.ndarray:
    """Facts §5: interior 1, linear ramps over the 26-px margins, corners 1 − clip(radius)."""
    inner = size - 2 * margin
    ramp = np.concatenate([np.linspace(1, 0, margin), np.zeros(inner), np.linspace(0, 1, margin)])
    return (1 - np.clip(np.sqrt(ramp[:, None] ** 2 + ramp[None, :] ** 2), 0, 1)).astype(np.float32)


def reference_paste(frame: np.ndarray, render: np.ndarray, matrix: np.ndarray, mask: np.ndarray) -> np.ndarray:
    h, w = frame.shape[:2]
    image = np.clip(render.transpose(1, 2, 0), 0, 1) * 255
    warped_mask = cv2.warpAffine(mask, matrix[:2], (w, h), flags=cv2.INTER_LINEAR).clip(0, 1)[..., None]
    warped = cv2.warpAffine(image.astype(np.float32), matrix[:2], (w, h), flags=cv2.INTER_LINEAR)
    return np.clip(warped_mask * warped + (1 - warped_mask) * frame, 0, 255).astype(np.uint8)


def smooth_render(seed: int, size: int = 512) -> np.ndarray:
    """A render with bounded gradients (random 16x16 upsampled), so sub-pixel rounding in any cv2 version stays < 1
    level."""
    low = np.random.default_rng(seed).random((16, 16, 3)).astype(np.float32) * 1.2 - 0.1
    return cv2.resize(low, (size, size), interpolation=cv2.INTER_LINEAR).transpose(2, 0, 1).copy()


def crop_to_original(angle: float, scale: float, tx: float, ty: float) -> np.ndarray:
    c, s = math.cos(angle) * scale, math.sin(angle) * scale
    return np.array([[c, -s, tx], [s, c, ty], [0, 0, 1]], dtype=np.float32)


def test_feather_mask_matches_the_reference_shape() -> None:
    mask = feather_mask().numpy()
    np.testing.assert_allclose(mask, reference_mask(), atol=1e-6)
    assert mask[26:486, 26:486].min() == 1.0 and mask[0, 256] == 0.0 and mask[0, 0] == 0.0
    assert mask[13, 256] == pytest.approx(13 / 25)


def test_paste_back_matches_cv2_within_one_gray_level() -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, H, W, 3), dtype=np.uint8)
    matrices = np.stack([crop_to_original(0.3, 0.17, 40.3, -10.7), crop_to_original(-0.2, 0.2, 20.0, 15.5)])
    renders = np.stack([smooth_render(1), smooth_render(2), smooth_render(3)])
    index = [1, 0, 1]
    paste = PasteBack(torch.from_numpy(frames), torch.from_numpy(matrices))
    out = paste(torch.from_numpy(renders), torch.tensor(index))
    assert out.shape == (3, H, W, 3) and out.dtype == torch.uint8
    for i, f in enumerate(index):
        expected = reference_paste(frames[f], renders[i], matrices[f], reference_mask())
        diff = np.abs(out[i].numpy().astype(int) - expected.astype(int))
        assert diff.max() <= 1, f"render {i}: {diff.max()} gray levels off"
        assert (diff > 0).mean() < 0.05, "only truncation flips differ"


def test_identity_keeps_the_frame_where_the_mask_is_zero() -> None:
    rng = np.random.default_rng(1)
    frame = rng.integers(0, 256, (1, 600, 560, 3), dtype=np.uint8)
    render = torch.from_numpy(smooth_render(4))[None].half()
    out = PasteBack(torch.from_numpy(frame), torch.eye(3)[None])(render)[0].numpy()
    mask = reference_mask()
    outside = np.ones((600, 560), dtype=bool)
    outside[:512, :512] = mask == 0
    assert np.array_equal(out[outside], frame[0][outside])
    inner = (np.clip(render[0].float().numpy().transpose(1, 2, 0), 0, 1) * 255).astype(np.uint8)
    diff = np.abs(out[100:400, 100:400].astype(int) - inner[100:400, 100:400].astype(int))
    assert diff.max() <= 1, "where the mask is 1 the render replaces the frame"


def test_bad_inputs_are_clear_errors() -> None:
    frames = torch.zeros(1, H, W, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="uint8"):
        PasteBack(frames.float(), torch.eye(3)[None])
    with pytest.raises(ValueError, match="one per frame"):
        PasteBack(frames, torch.eye(3))
    with pytest.raises(ValueError, match="outside"):
        PasteBack(frames, torch.tensor([[[1.0, 0, 5000], [0, 1, 0], [0, 0, 1]]]))
    with pytest.raises(ValueError, match="render must be"):
        PasteBack(frames, torch.eye(3)[None])(torch.zeros(1, 3, 256, 256))

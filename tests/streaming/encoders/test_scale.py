"""Scaling frames to the output size where they are: the picture kept, its aspect kept, its sides even."""

from __future__ import annotations

import pytest
import torch

from streaming.encoders.colour import rgb_to_i420_batch
from streaming.encoders.scale import scale_frames
from streaming.output_settings import output_size


def studio_like(width: int, height: int) -> torch.Tensor:
    """One (1, H, W, 3) frame: a horizontal ramp, a bright box a fifth of the height, a dark band."""
    image = torch.zeros(1, height, width, 3, dtype=torch.uint8)
    image[..., 0] = torch.linspace(0, 255, width).round().to(torch.uint8)
    image[:, height // 5 : 2 * height // 5, width // 3 : width // 2] = 230
    image[:, 4 * height // 5 :, :, 1] = 20
    return image


def test_a_downscale_by_two_thirds_keeps_the_picture() -> None:
    frame = studio_like(480, 270)
    scaled = scale_frames(frame, 320, 180)
    assert scaled.shape == (1, 180, 320, 3) and scaled.dtype == torch.uint8
    box = scaled[0, 180 // 5 + 2 : 2 * 180 // 5 - 2, 320 // 3 + 2 : 320 // 2 - 2]
    assert (box == 230).all(), "a flat area stays exactly its colour"
    ramp = scaled[0, 0, :, 0].float()
    assert (ramp[1:] >= ramp[:-1]).all() and ramp[0] < 3 and ramp[-1] > 252


def test_every_named_size_of_a_1080p_anchor_keeps_16_9_and_even_sides() -> None:
    frame = studio_like(1920, 1080)
    assert scale_frames(frame, *output_size(1920, 1080, "avatar")) is frame, "the avatar's own size: no work, no copy"
    for size, expected in (("1080p", (1920, 1080)), ("720p", (1280, 720)), ("540p", (960, 540))):
        width, height = output_size(1920, 1080, size)
        assert (width, height) == expected
        scaled = scale_frames(frame, width, height)
        assert scaled.shape[1:3] == (height, width)
        assert rgb_to_i420_batch(scaled).shape == (1, height * 3 // 2, width), "the result converts to I420"


def test_an_odd_aspect_rounds_to_even_sides() -> None:
    width, height = output_size(1350, 1080, "540p")
    assert (width, height) == (676, 540), "675 px wide at the exact aspect: the nearest even width"
    assert scale_frames(studio_like(1350, 1080), width, height).shape[1:3] == (540, 676)


def test_odd_sides_and_non_rgb_frames_are_refused() -> None:
    with pytest.raises(ValueError, match="even"):
        scale_frames(studio_like(64, 36), 31, 18)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\) uint8"):
        scale_frames(studio_like(64, 36)[0], 32, 18)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_frames_on_the_gpu_stay_there_and_match_the_cpu() -> None:
    frame = studio_like(640, 360)
    on_gpu = scale_frames(frame.cuda(), 426, 240)
    assert on_gpu.is_cuda
    assert (on_gpu.cpu().int() - scale_frames(frame, 426, 240).int()).abs().max() <= 1

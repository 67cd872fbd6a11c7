"""RGB -> 4:2:0 on the frame's device: BT.709 limited range, the layouts x264 and NVENC take."""

from __future__ import annotations

import av
import numpy as np
import pytest
import torch

from streaming.encoders.colour import rgb_to_i420, rgb_to_nv12

# BT.709 limited-range (Y, Cb, Cr) of the primaries, black, white and mid grey.
REFERENCE = {
    (255, 0, 0): (63, 102, 240),
    (0, 255, 0): (173, 42, 26),
    (0, 0, 255): (32, 240, 118),
    (255, 255, 255): (235, 128, 128),
    (0, 0, 0): (16, 128, 128),
    (128, 128, 128): (126, 128, 128),
}


def smooth_image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    """A smooth random RGB picture (what video looks like, unlike noise)."""
    base = torch.rand(1, 3, 6, 8, generator=torch.Generator().manual_seed(seed))
    up = torch.nn.functional.interpolate(base, size=(height, width), mode="bilinear", align_corners=False)
    return (up[0].permute(1, 2, 0) * 255).round().to(torch.uint8).contiguous()


@pytest.mark.parametrize("rgb", list(REFERENCE))
def test_flat_colours_give_the_bt709_limited_range_values(rgb: tuple[int, int, int]) -> None:
    image = torch.tensor(rgb, dtype=torch.uint8).expand(4, 6, 3).contiguous()
    i420 = rgb_to_i420(image)
    y, cb, cr = REFERENCE[rgb]
    assert i420.shape == (6, 6)
    assert (i420[:4] == y).all()
    assert (i420[4:].reshape(-1)[:6] == cb).all() and (i420[4:].reshape(-1)[6:] == cr).all()


def test_i420_matches_libswscale_bt709() -> None:
    image = smooth_image(48, 64)
    ours = rgb_to_i420(image).numpy().astype(int)
    frame = av.VideoFrame.from_ndarray(image.numpy(), format="rgb24")
    theirs = frame.reformat(format="yuv420p", dst_colorspace="ITU709").to_ndarray().astype(int)
    assert np.abs(ours[:48] - theirs[:48]).max() <= 1
    assert np.abs(ours[48:] - theirs[48:]).max() <= 2


def test_nv12_interleaves_the_same_planes() -> None:
    image = smooth_image(32, 48, seed=1)
    i420, nv12 = rgb_to_i420(image), rgb_to_nv12(image)
    assert nv12.shape == i420.shape == (48, 48)
    assert torch.equal(nv12[:32], i420[:32])
    quarter = 32 * 48 // 4
    chroma = i420[32:].reshape(-1)
    assert torch.equal(nv12[32:].reshape(-1, 2)[:, 0], chroma[:quarter])
    assert torch.equal(nv12[32:].reshape(-1, 2)[:, 1], chroma[quarter:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_gives_the_cpu_result() -> None:
    image = smooth_image(64, 96, seed=2)
    out = rgb_to_i420(image.cuda())
    assert out.device.type == "cuda"
    assert (out.cpu().int() - rgb_to_i420(image).int()).abs().max() <= 1


@pytest.mark.parametrize(
    "image, message",
    [
        (torch.zeros(4, 6, 3, dtype=torch.float32), "uint8"),
        (torch.zeros(3, 4, 6, dtype=torch.uint8), r"\(H, W, 3\)"),
        (torch.zeros(5, 6, 3, dtype=torch.uint8), "even"),
    ],
)
def test_bad_frames_are_refused(image: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rgb_to_i420(image)

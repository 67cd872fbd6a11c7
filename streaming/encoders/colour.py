"""RGB -> 4:2:0 YUV on whatever device the frame is on (torch), BT.709 limited ("TV") range.

BT.709 is the matrix for HD video and what browsers and broadcast players assume for it; the
encoders also write it into the stream's VUI, so no player has to guess. Limited range means
Y in [16, 235] and Cb/Cr in [16, 240]. Chroma is the mean of each 2x2 block (centre siting); values are rounded (+0.5,
then truncated).
The output is one contiguous (H * 3/2, W) uint8 tensor: I420 (Y, then U, then V planes) for
libx264, NV12 (Y, then interleaved UV) for NVENC.
"""

from __future__ import annotations

import functools

import torch

from streaming.frames import check_image

KR, KB = 0.2126, 0.0722
KG = 1.0 - KR - KB
Y_SCALE, C_SCALE = 219.0 / 255.0, 224.0 / 255.0
_LUMA = (KR * Y_SCALE, KG * Y_SCALE, KB * Y_SCALE)
_CB = tuple(c * C_SCALE / (2 * (1 - KB)) for c in (-KR, -KG, 1 - KB))
_CR = tuple(c * C_SCALE / (2 * (1 - KR)) for c in (1 - KR, -KG, -KB))


@functools.cache
def _transform(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets (3,), matrix (3, 3)) taking RGB rows to Y, Cb, Cr rows, the +0.5 of rounding folded into the offsets.

    Made once per device and complete before it is shared: encoder threads read it from their own streams."""
    matrix = torch.tensor((_LUMA, _CB, _CR), dtype=torch.float32, device=device).T.contiguous()
    offsets = torch.tensor((16.5, 128.5, 128.5), device=device)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return offsets, matrix


def _yuv(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Y (N, H, W) and the 2x2-block means of Cb, Cr (N, H/2, W/2, 2) of N images, unrounded floats: one matrix
    product for all three (the conversion is linear, so averaging after it equals averaging the RGB first)."""
    count = images.shape[0]
    height, width = check_image(images[0])
    offsets, matrix = _transform(images.device)
    yuv = torch.addmm(offsets, images.reshape(-1, 3).float(), matrix).view(count, height // 2, 2, width // 2, 2, 3)
    return yuv[..., 0].reshape(count, height, width), yuv[..., 1:].mean(dim=(2, 4))


def _packed(planes: list[torch.Tensor], height: int, width: int) -> torch.Tensor:
    """Float planes of N images -> one contiguous (N, H * 3/2, W) uint8 tensor, clamped and truncated (after the +0.5:
    rounded)."""
    count = planes[0].shape[0]
    flat = torch.cat([plane.reshape(count, -1) for plane in planes], dim=1)
    return flat.clamp_(0, 255).to(torch.uint8).view(count, height * 3 // 2, width)


def rgb_to_i420(image: torch.Tensor) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (H * 3/2, W) uint8 planar Y, U, V (yuv420p), on the same device."""
    return rgb_to_i420_batch(image[None])[0]


def rgb_to_i420_batch(images: torch.Tensor) -> torch.Tensor:
    """(N, H, W, 3) uint8 RGB -> (N, H * 3/2, W) uint8 I420, on the same device: the engine core converts a
    session's frames of one render call in one go."""
    luma, chroma = _yuv(images)
    return _packed([luma, chroma[..., 0], chroma[..., 1]], *luma.shape[1:])


def rgb_to_nv12(image: torch.Tensor) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (H * 3/2, W) uint8 NV12 (Y plane, then interleaved U, V), on the same device."""
    luma, chroma = _yuv(image[None])
    return _packed([luma, chroma], *luma.shape[1:])[0]

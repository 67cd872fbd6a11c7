"""RGB -> 4:2:0 YUV on whatever device the frame is on (torch), BT.709 limited ("TV") range.

BT.709 is the matrix for HD video and what browsers and broadcast players assume for it; the
encoders also write it into the stream's VUI, so no player has to guess. Limited range means
Y in [16, 235] and Cb/Cr in [16, 240]. Chroma is the mean of each 2x2 block (centre siting); values are rounded (+0.5, then truncated).
The output is one contiguous (H * 3/2, W) uint8 tensor: I420 (Y, then U, then V planes) for
libx264, NV12 (Y, then interleaved UV) for NVENC.
"""

from __future__ import annotations

import torch

from streaming.frames import check_image

KR, KB = 0.2126, 0.0722
KG = 1.0 - KR - KB
Y_SCALE, C_SCALE = 219.0 / 255.0, 224.0 / 255.0
_LUMA = (KR * Y_SCALE, KG * Y_SCALE, KB * Y_SCALE)
_CB = tuple(c * C_SCALE / (2 * (1 - KB)) for c in (-KR, -KG, 1 - KB))
_CR = tuple(c * C_SCALE / (2 * (1 - KR)) for c in (1 - KR, -KG, -KB))


def _planes(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Y (H, W), U and V (H/2, W/2) as uint8 on the image's device."""
    check_image(image)
    rgb = image.float()
    y = rgb[..., 0] * _LUMA[0] + rgb[..., 1] * _LUMA[1] + rgb[..., 2] * _LUMA[2] + 16.5
    quad = (rgb[0::2, 0::2] + rgb[1::2, 0::2] + rgb[0::2, 1::2] + rgb[1::2, 1::2]) * 0.25
    r, g, b = quad[..., 0], quad[..., 1], quad[..., 2]
    u = r * _CB[0] + g * _CB[1] + b * _CB[2] + 128.5
    v = r * _CR[0] + g * _CR[1] + b * _CR[2] + 128.5
    return tuple(p.clamp_(0, 255).to(torch.uint8) for p in (y, u, v))  # type: ignore[return-value]


def rgb_to_i420(image: torch.Tensor) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (H * 3/2, W) uint8 planar Y, U, V (yuv420p), on the same device."""
    y, u, v = _planes(image)
    height, width = y.shape
    out = torch.empty(height * 3 // 2, width, dtype=torch.uint8, device=image.device)
    out[:height] = y
    chroma = out[height:].view(-1)
    quarter = height * width // 4
    chroma[:quarter] = u.reshape(-1)
    chroma[quarter:] = v.reshape(-1)
    return out


def rgb_to_nv12(image: torch.Tensor) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (H * 3/2, W) uint8 NV12 (Y plane, then interleaved U, V), on the same device."""
    y, u, v = _planes(image)
    height, width = y.shape
    out = torch.empty(height * 3 // 2, width, dtype=torch.uint8, device=image.device)
    out[:height] = y
    out[height:].view(height // 2, width // 2, 2).copy_(torch.stack((u, v), dim=-1))
    return out

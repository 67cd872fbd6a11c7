"""Scale RGB frames to a session's output size on whatever device they are on, before the colour conversion.

The paste-back makes frames at the avatar's size; a session may stream smaller (``streaming.output_settings``).
Scaling where the frames are (the GPU in production) keeps them there until the encoder and shrinks what crosses
the bus. Downscaling is bilinear with antialiasing (each output pixel averages the input pixels it covers, as an
area filter does at whole ratios), so 1080p -> 720p does not alias fine detail such as hair and text.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from streaming.frames import check_size


def scale_frames(images: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(N, H, W, 3) uint8 RGB -> (N, height, width, 3) uint8 RGB on the same device (the input itself when the size
    is already right)."""
    check_size(width, height)
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != torch.uint8:
        raise ValueError(f"frames must be (N, H, W, 3) uint8 RGB, got {tuple(images.shape)} {images.dtype}")
    if tuple(images.shape[1:3]) == (height, width):
        return images
    planar = images.permute(0, 3, 1, 2).float()
    scaled = F.interpolate(planar, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return scaled.add_(0.5).clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()

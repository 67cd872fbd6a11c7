"""What the engine reads of a registered avatar, declared here so that the engine never imports ``avatars``.

``avatars.cache.Avatar`` (built by registration, loaded from the cache) has these fields; so may
any other source of avatars (a test's synthetic one). Every tensor's leading axis N is the source frame.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Avatar(Protocol):
    """A registered avatar: appearance feature, source motion, eye features and paste-back tables."""

    name: str
    f_s: torch.Tensor
    """Appearance feature (N,32,16,64,64)."""
    pitch: torch.Tensor
    yaw: torch.Tensor
    roll: torch.Tensor
    t: torch.Tensor
    exp: torch.Tensor
    scale: torch.Tensor
    kp: torch.Tensor
    """Source motion per frame (pose bin logits, translation, expression, scale, keypoints)."""
    sc: torch.Tensor
    """The first frame's canonical keypoints (unsmoothed), the condition's keypoint part."""
    eye_open: torch.Tensor
    eye_ball: torch.Tensor
    M_c2o: torch.Tensor
    """Maps 512-crop pixels to frame pixels."""
    mask_crop: torch.Tensor
    """The feathered paste-back mask."""
    frames: torch.Tensor
    """The RGB source frames."""
    is_image: bool
    manifest: dict[str, Any]
    """The cache manifest; its ``tensors.crc32`` identifies the avatar's content."""

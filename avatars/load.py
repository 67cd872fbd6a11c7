"""An avatar from what a user names: a cached one by name or folder, or a portrait file registered now.

Registering needs the face models (the ``face`` extra); loading a cached avatar does not, so the
registration is imported only when a file is given.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from avatars.cache import Avatar, load_avatar


def load_or_register(avatar: str, checkpoints: Path, device: torch.device, random_weights: bool) -> Avatar:
    """A cached avatar by name, or register an image/video path on the fly into a temporary cache."""
    path = Path(avatar)
    if path.is_file():
        from avatars.register import register

        cache = Path(tempfile.mkdtemp(prefix="ditto-avatar-"))
        folder = register(path, "oneshot", checkpoints, device=device, cache_dir=cache, random_weights=random_weights)
        return load_avatar(folder, device)
    return load_avatar(avatar, device, checkpoints=checkpoints)

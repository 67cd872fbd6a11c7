"""An avatar from what a user names: a cached one by name or folder, a portrait file registered now, or the demo.

Registering needs the face models (the ``face`` extra); loading a cached avatar does not, so the
registration is imported only when a file is given, or the first time the demo portrait is used.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from avatars.cache import Avatar, load_avatar
from avatars.errors import CacheError
from engine.cache_root import cache_root

DEMO_NAME = "demo"


def load_or_register(avatar: str, checkpoints: Path, device: torch.device, random_weights: bool) -> Avatar:
    """A cached avatar by name, or register an image/video path on the fly into a temporary cache, removed once the
    avatar is loaded (its tensors are read whole)."""
    path = Path(avatar)
    if path.is_file():
        from avatars.register import register

        with tempfile.TemporaryDirectory(prefix="ditto-avatar-") as cache:
            folder = register(
                path, "oneshot", checkpoints, device=device, cache_dir=Path(cache), random_weights=random_weights
            )
            return load_avatar(folder, device)
    return load_avatar(avatar, device, checkpoints=checkpoints)


def demo_cache() -> Path:
    """Where the demo portrait's avatar is kept: the engine's cache, apart from the user's avatars."""
    return cache_root() / "demo-avatar"


def demo_avatar(checkpoints: Path, device: torch.device) -> Avatar:
    """The demo portrait (scikit-image's astronaut) on ``checkpoints``: registered the first time (or again when
    ``checkpoints`` changed or the cache is damaged), loaded from ``demo_cache()`` after, so a demo starts in
    seconds."""
    try:
        return load_avatar(DEMO_NAME, device, checkpoints=checkpoints, cache_dir=demo_cache())
    except CacheError:
        pass
    from avatars.register import register
    from engine.assets import write_demo_portrait

    with tempfile.TemporaryDirectory(prefix="ditto-demo-") as folder:
        portrait = write_demo_portrait(folder)
        cached = register(portrait, DEMO_NAME, checkpoints, device=device, cache_dir=demo_cache(), random_weights=True)
    return load_avatar(cached, device)

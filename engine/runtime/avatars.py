"""Avatars on the device, shared by every session that speaks with them.

The appearance features, source motion and paste-back tables of an avatar are loaded once
per runtime, however many sessions use it; per-session memory is motion state and queues.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.avatar import Avatar
from engine.motion.stitching import SOURCE_KEYS
from engine.motion.vector import join_motion
from engine.render.paste_back import PasteBack


@dataclass
class LoadedAvatar:
    """One avatar's device tensors in the dtypes the networks want, and its compositor."""

    name: str
    f_s: torch.Tensor
    source: dict[str, torch.Tensor]
    source_motion: torch.Tensor
    canonical_kp: torch.Tensor
    eye_open: torch.Tensor
    eye_ball: torch.Tensor
    paste: PasteBack
    is_image: bool
    users: int = 0

    @property
    def num_frames(self) -> int:
        return int(self.f_s.shape[0])


def avatar_key(avatar: Avatar) -> tuple:
    """Identity of an avatar's content: its name and the checksum of its cached tensors (object identity otherwise)."""
    crc = avatar.manifest.get("tensors", {}).get("crc32") if isinstance(avatar.manifest, dict) else None
    return (avatar.name, crc) if crc is not None else (avatar.name, id(avatar))


class AvatarStore:
    """Reference-counted device copies of avatars, keyed by content."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype
        self._loaded: dict[tuple, LoadedAvatar] = {}

    def acquire(self, avatar: Avatar) -> LoadedAvatar:
        """The shared device copy of ``avatar`` (loaded on first use)."""
        key = avatar_key(avatar)
        loaded = self._loaded.get(key)
        if loaded is None:
            loaded = self._load(avatar)
            self._loaded[key] = loaded
        loaded.users += 1
        return loaded

    def release(self, loaded: LoadedAvatar) -> None:
        """One user fewer; the device copy is freed with its last user."""
        loaded.users -= 1
        if loaded.users <= 0:
            self._loaded = {k: v for k, v in self._loaded.items() if v is not loaded}

    def __len__(self) -> int:
        return len(self._loaded)

    def _load(self, avatar: Avatar) -> LoadedAvatar:
        device = self.device
        source = {k: getattr(avatar, k).to(device, torch.float32) for k in SOURCE_KEYS}
        return LoadedAvatar(
            name=avatar.name,
            f_s=avatar.f_s.to(device, self.dtype),
            source=source,
            source_motion=join_motion({k: v[:1] for k, v in source.items() if k != "kp"})[0],
            # The condition uses the first frame's unsmoothed keypoints, as the reference does (``sc``).
            canonical_kp=avatar.sc.reshape(-1).to(device, torch.float32),
            eye_open=avatar.eye_open.to(device),
            eye_ball=avatar.eye_ball.to(device),
            paste=PasteBack(avatar.frames.to(device), avatar.M_c2o.to(device), avatar.mask_crop.to(device)),
            is_image=bool(avatar.is_image),
        )

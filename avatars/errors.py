"""The errors registration and loading raise: each message says what was wrong and what to do."""

from __future__ import annotations


class AvatarError(Exception):
    """Base class: registering or loading an avatar failed for a reason the user can fix."""


class MediaError(AvatarError):
    """The source file is missing, not an image or video, or unusable."""


class FaceError(AvatarError):
    """No usable face in the source: none found, too small, or an invalid --face-box / --face-index."""


class CacheError(AvatarError):
    """A cached avatar is missing, corrupted or incomplete."""


class StaleCacheError(CacheError):
    """A cached avatar was made with another cache format or other checkpoints and must be rebuilt."""

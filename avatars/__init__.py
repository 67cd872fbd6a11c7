"""Avatar registration: a portrait (image or short video) turned once into a cached avatar.

``python -m apps.avatars register`` runs face detection, the 512 crop, eye features and the two
extractor networks, and writes a safetensors + JSON cache; ``load_avatar`` puts it on a device.
"""

from avatars.cache import Avatar, load_avatar
from avatars.errors import AvatarError, CacheError, FaceError, MediaError, StaleCacheError

__all__ = ["Avatar", "AvatarError", "CacheError", "FaceError", "MediaError", "StaleCacheError", "load_avatar"]

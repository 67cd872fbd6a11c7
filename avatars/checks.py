"""Checks of a cached avatar beyond its checksum: every manifest field, the tensor header, the tensors' values.

A CRC-32 proves the files were written together, not that they are sane: a cache edited with its checksum
recomputed, or written by a faulty tool, could hold NaN in the crop matrix, a negative crop size, a name with
control characters or ``is_image: "no"``, and fail late with an obscure error or render garbage. Each check
raises CacheError naming the field, at load, before anything is rendered.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from avatars.errors import CacheError
from engine.nesting import nested_over

MAX_JSON_BYTES = 1 << 20
"""A manifest or tensor header larger than this is refused (a real one is a few KB)."""
MAX_DEPTH = 8
"""JSON nested deeper than this is refused (a manifest nests three levels)."""
MAX_SIDE = 16384
"""The largest frame side in pixels the manifest may record."""
MAX_COORD = 1e6
"""The largest magnitude in a crop matrix (crop pixels to frame pixels: at most a few times the frame side)."""
CROP_SIZE = 512
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""An avatar name usable as a directory name."""
_RANGES = {"M_c2o": (-MAX_COORD, MAX_COORD), "mask_crop": (0.0, 1.0)}
"""Tensors whose values have bounds beyond being finite: the crop matrix, the paste-back mask's weights."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
Check = Callable[[Any], bool]


def parse_json(raw: bytes | str, what: str) -> Any:
    """``raw`` as JSON at most MAX_JSON_BYTES long and MAX_DEPTH deep; ValueError says which limit or why not."""
    if len(raw) > MAX_JSON_BYTES:
        raise ValueError(f"{len(raw) >> 20} MB, over the limit of {MAX_JSON_BYTES >> 20} MB for {what}")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{what} is nested too deep to read") from None
    if nested_over(value, MAX_DEPTH):
        raise ValueError(f"{what} is nested more than {MAX_DEPTH} deep")
    return value


def _int(lo: int, hi: int) -> Check:
    return lambda v: type(v) is int and lo <= v <= hi


def _real(lo: float, hi: float) -> Check:
    return lambda v: type(v) in (int, float) and math.isfinite(v) and lo <= v <= hi


def _text(limit: int = 4096) -> Check:
    return lambda v: isinstance(v, str) and len(v) <= limit and v.isprintable()


def _one_of(*choices: Any) -> Check:
    return lambda v: isinstance(v, str) and v in choices


def _boolean(v: Any) -> bool:
    return isinstance(v, bool)


def _hashes(v: Any) -> bool:
    return isinstance(v, dict) and all(_text(64)(k) and isinstance(h, str) and _HEX64.match(h) for k, h in v.items())


def _box(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 4 and all(_real(-MAX_COORD, MAX_COORD)(x) for x in v)


_FIELDS: dict[str, tuple[bool, Check, str]] = {
    "format": (True, _int(0, 1 << 30), "a whole number"),
    "name": (True, lambda v: isinstance(v, str) and NAME.match(v) is not None, "1-64 letters, digits, '.', '_' or '-'"),
    "created": (False, _text(64), "a printable time stamp"),
    "is_image": (True, _boolean, "true or false"),
    "tensors.file": (True, _text(255), "a file name"),
    "tensors.bytes": (True, _int(8, 1 << 40), "a size in bytes"),
    "tensors.crc32": (True, _int(0, (1 << 32) - 1), "a CRC-32 (0 to 2**32 - 1)"),
    "source.path": (False, _text(), "a printable path"),
    "source.sha256": (False, lambda v: isinstance(v, str) and _HEX64.match(v) is not None, "64 hex digits"),
    "source.kind": (True, _one_of("image", "video"), "image or video"),
    "source.frames": (True, _int(1, 1 << 20), "a number of frames ≥ 1"),
    "source.fps": (
        False,
        lambda v: v is None or _real(0.01, 1000.0)(v),
        "frames per second in (0, 1000], or null (an image)",
    ),
    "source.height": (False, _int(1, MAX_SIDE), f"pixels in [1, {MAX_SIDE}]"),
    "source.width": (False, _int(1, MAX_SIDE), f"pixels in [1, {MAX_SIDE}]"),
    "source.original_height": (False, _int(1, 1 << 20), "pixels ≥ 1"),
    "source.original_width": (False, _int(1, 1 << 20), "pixels ≥ 1"),
    "checkpoints.directory": (False, _text(), "a printable path"),
    "checkpoints.random_weights": (False, _boolean, "true or false"),
    "checkpoints.sha256": (True, _hashes, "network names mapped to 64 hex digits"),
    "crop.dsize": (
        False,
        lambda v: v == CROP_SIZE and type(v) is int,
        f"{CROP_SIZE}, the side of the crop and its mask",
    ),
    "crop.scale": (False, _real(0.1, 10.0), "a face-extent multiplier in [0.1, 10]"),
    "crop.vx_ratio": (False, _real(-1.0, 1.0), "a fraction of the side in [-1, 1]"),
    "crop.vy_ratio": (False, _real(-1.0, 1.0), "a fraction of the side in [-1, 1]"),
    "crop.rotate": (False, _boolean, "true or false"),
    "smoothing_frames": (False, _int(1, 1000), "a number of frames in [1, 1000]"),
    "faces.kind": (False, _text(64), "printable text"),
    "faces.detectors": (False, _text(256), "printable text"),
    "faces.landmarks": (False, _text(256), "printable text"),
    "faces.eyes": (False, _text(256), "printable text"),
    "faces.detector_used": (False, _text(256), "printable text"),
    "faces.box": (False, _box, "four finite pixel coordinates"),
    "faces.face_index": (False, lambda v: v is None or _int(0, 1 << 16)(v), "a face index ≥ 0"),
    "device": (False, _text(64), "printable text"),
    "registration_seconds": (False, _real(0.0, 1e7), "seconds ≥ 0"),
}
"""Every field the registration writes: (required, check, what it accepts); other fields are ignored."""


def check_manifest(manifest: Mapping[str, Any], where: str) -> None:
    """CacheError naming the first manifest field that is missing where required or not what it accepts."""
    for section in {field.split(".")[0] for field in _FIELDS if "." in field}:
        if section in manifest and not isinstance(manifest[section], dict):
            raise CacheError(f"{where}: manifest field '{section}' must be an object; register the avatar again")
    for field, (required, check, what) in _FIELDS.items():
        *parent, key = field.split(".")
        holder = manifest.get(parent[0], {}) if parent else manifest
        if key not in holder:
            if required:
                raise CacheError(f"{where}: manifest field '{field}' is missing; register the avatar again")
            continue
        if not check(holder[key]):
            raise CacheError(
                f"{where}: manifest field '{field}' must be {what}, got {_shown(holder[key])}; register the avatar "
                "again"
            )
    if manifest["is_image"] != (manifest["source"]["kind"] == "image"):
        raise CacheError(f"{where}: manifest field 'is_image' contradicts 'source.kind'; register the avatar again")


def check_tensors(manifest: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], where: str) -> None:
    """CacheError if the tensors disagree with the manifest or hold values that would render garbage."""
    frames = tensors["frames"]
    source = manifest["source"]
    if source["frames"] != frames.shape[0] or (manifest["is_image"] and frames.shape[0] != 1):
        raise CacheError(
            f"{where}: manifest field 'source.frames' ({source['frames']}, image: {manifest['is_image']}) "
            f"does not match the {frames.shape[0]} frame(s) of the tensors; register the avatar again"
        )
    for field, size in (("height", frames.shape[1]), ("width", frames.shape[2])):
        if field in source and source[field] != size:
            raise CacheError(
                f"{where}: manifest field 'source.{field}' does not match the frames' {size} pixels; register the "
                "avatar again"
            )
    floats = {key: t for key, t in tensors.items() if t.is_floating_point()}
    problems = [
        (key, "NaN or infinite values", torch.logical_not(torch.isfinite(t).all())) for key, t in floats.items()
    ]
    for key, (lo, hi) in _RANGES.items():
        problems.append((key, f"values outside [{lo:g}, {hi:g}]", ((floats[key] < lo) | (floats[key] > hi)).any()))
    for (key, what, _), found in zip(problems, torch.stack([flag for *_, flag in problems]).tolist()):
        if found:
            raise CacheError(f"{where}: tensor '{key}' holds {what}; register the avatar again")


def _shown(value: Any) -> str:
    """``value`` for a message, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."

"""The avatar cache: one directory per avatar, tensors in safetensors plus a JSON manifest.

Loading reads no code and needs no face model: the manifest is JSON and the tensor file is
parsed here as plain safetensors (an 8-byte header length, a JSON header, raw little-endian
data), checked against the manifest and its CRC-32, copied to the device in one transfer and
sliced into views. A cache written under another format version, or compared against other
checkpoints, is refused with the command that rebuilds it. Writing goes to a temporary
directory that is renamed into place, so a failed registration leaves nothing half-written.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import stat
import tempfile
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from safetensors.numpy import save_file

from avatars.checks import MAX_JSON_BYTES, check_manifest, check_tensors, parse_json
from avatars.checks import NAME as _NAME
from avatars.errors import CacheError, StaleCacheError
from engine.networks import OFFICIAL_FILENAMES
from engine.plans.hash_ahead import hash_ahead, sha256_of

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSORS = "tensors.safetensors"
REGISTRATION_NETWORKS: tuple[str, ...] = ("motion_extractor", "appearance_extractor")
ENV_CACHE_DIR = "DITTO_AVATAR_DIR"

_DTYPES = {"F32": (torch.float32, 4), "U8": (torch.uint8, 1)}
_DTYPE_NAMES = {"F32": ("F32", "float32"), "U8": ("U8", "uint8")}
_HASH_MEMO: dict[tuple[str, int, int], str] = {}
_TENSOR_SPEC: dict[str, tuple[str, tuple[int | str, ...]]] = {
    "f_s": ("F32", ("N", 32, 16, 64, 64)),
    "pitch": ("F32", ("N", 66)),
    "yaw": ("F32", ("N", 66)),
    "roll": ("F32", ("N", 66)),
    "t": ("F32", ("N", 3)),
    "exp": ("F32", ("N", 63)),
    "scale": ("F32", ("N", 1)),
    "kp": ("F32", ("N", 63)),
    "M_c2o": ("F32", ("N", 3, 3)),
    "eye_open": ("F32", ("N", 2)),
    "eye_ball": ("F32", ("N", 6)),
    "sc": ("F32", (63,)),
    "mask_crop": ("F32", (512, 512)),
    "frames": ("U8", ("N", "H", "W", 3)),
}


@dataclass(repr=False)
class Avatar:
    """A registered avatar on one device; every tensor's leading axis N is the source frame.

    Motion (pitch/yaw/roll logits, t, exp, scale, kp) is smoothed over time for videos; ``sc``
    is the first frame's canonical keypoints; ``M_c2o`` maps 512-crop pixels to frame pixels;
    ``mask_crop`` is the feathered paste-back mask; ``frames`` are the RGB source frames.
    """

    name: str
    f_s: torch.Tensor
    pitch: torch.Tensor
    yaw: torch.Tensor
    roll: torch.Tensor
    t: torch.Tensor
    exp: torch.Tensor
    scale: torch.Tensor
    kp: torch.Tensor
    M_c2o: torch.Tensor
    eye_open: torch.Tensor
    eye_ball: torch.Tensor
    sc: torch.Tensor
    mask_crop: torch.Tensor
    frames: torch.Tensor
    is_image: bool
    manifest: dict[str, Any]

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def __repr__(self) -> str:
        height, width = self.frames.shape[1:3]
        kind = "image" if self.is_image else "video"
        return f"Avatar({self.name!r}, {kind}, {self.num_frames} frame(s) {width}x{height}, on {self.f_s.device})"


def default_cache_dir() -> Path:
    """$DITTO_AVATAR_DIR, or ~/.cache/ditto-live/avatars."""
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env) if env else Path.home() / ".cache" / "ditto-live" / "avatars"


def check_name(name: str) -> str:
    """An avatar name usable as a directory name: letters, digits, '.', '_' and '-', 64 at most."""
    if not _NAME.match(name):
        raise CacheError(
            f"invalid avatar name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, remembered per (path, size, mtime) so checkpoints are hashed once per process; a hash
    started ahead (``hash_checkpoints_ahead``) is taken when it is done."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASH_MEMO:
        _HASH_MEMO[key] = sha256_of(path)
    return _HASH_MEMO[key]


def hash_checkpoints_ahead(directory: str | Path) -> None:
    """Start hashing, in the background, the checkpoints a cached avatar's load checks (the motion extractor's is
    112 MB), so that a start overlaps it with loading the networks; files not there are left to the load to report."""
    try:
        files = checkpoint_files(Path(directory))
    except CacheError:
        return
    hash_ahead(files.values())


def checkpoint_files(directory: Path, names: tuple[str, ...] = REGISTRATION_NETWORKS) -> dict[str, Path]:
    """The official checkpoint files for ``names`` in ``directory`` or its ``models/`` folder."""
    found: dict[str, Path] = {}
    for name in names:
        candidates = [directory / OFFICIAL_FILENAMES[name], directory / "models" / OFFICIAL_FILENAMES[name]]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise CacheError(
                f"checkpoint {OFFICIAL_FILENAMES[name]} not found in {directory} or {directory / 'models'} "
                f"(give the folder of the official ditto_pytorch/models/*.pth files)"
            )
        found[name] = path
    return found


def checkpoint_hashes(directory: str | Path) -> dict[str, str]:
    """SHA-256 of the registration networks' checkpoint files in ``directory``, as the manifest records them."""
    files = checkpoint_files(Path(directory))
    return {name: file_sha256(path) for name, path in files.items()}


def save_avatar(
    tensors: Mapping[str, np.ndarray], manifest: dict[str, Any], name: str, cache_dir: str | Path | None
) -> Path:
    """Write ``tensors`` and ``manifest`` as avatar ``name``, atomically replacing any older one."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    check_name(name)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    final = root / name
    try:
        arrays = {k: np.ascontiguousarray(tensors[k]) for k in _TENSOR_SPEC}
        _check_shapes({k: (a.dtype.name, a.shape) for k, a in arrays.items()}, f"avatar {name!r}")
        save_file(arrays, str(staging / TENSORS))
        data = (staging / TENSORS).read_bytes()
        full = {
            "format": FORMAT_VERSION,
            "name": name,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            **manifest,
            "is_image": manifest["source"]["kind"] == "image",
            "tensors": {"file": TENSORS, "bytes": len(data), "crc32": zlib.crc32(data)},
        }
        (staging / MANIFEST).write_text(json.dumps(full, indent=2) + "\n")
        for path, mode in ((staging, 0o755), (staging / TENSORS, 0o644), (staging / MANIFEST, 0o644)):
            path.chmod(mode)
        if final.exists():
            old = root / f".old-{name}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            staging.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def resolve(name_or_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The avatar directory for a name in the cache, or a path to an avatar directory."""
    path = Path(name_or_path)
    if (path / MANIFEST).is_file():
        return path
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if isinstance(name_or_path, str) and _NAME.match(name_or_path) and (root / name_or_path).is_dir():
        return root / name_or_path
    raise CacheError(
        f"no avatar {str(name_or_path)!r} in {root}; register it first: "
        f"python -m apps.avatars register PORTRAIT --name {shlex.quote(path.name) if path.name else 'NAME'}"
    )


def manifest_json(directory: Path) -> Any:
    """The avatar's manifest as plain JSON, not yet checked (a listing shows stale ones too): read only from a regular
    file, bounded in size and depth; CacheError otherwise."""
    try:
        with _open_regular(directory / MANIFEST) as file:
            return parse_json(file.read(MAX_JSON_BYTES + 1), "a manifest")
    except FileNotFoundError as exc:
        raise CacheError(f"{directory}: no {MANIFEST}; the cache is incomplete, register the avatar again") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise CacheError(f"{directory / MANIFEST} is corrupted ({exc}); register the avatar again") from exc


def read_manifest(directory: Path) -> dict[str, Any]:
    """The avatar's manifest, checked for this format version."""
    manifest = manifest_json(directory)
    if not isinstance(manifest, dict):
        raise CacheError(f"{directory / MANIFEST} is corrupted (not a JSON object); register the avatar again")
    version = manifest.get("format")
    if type(version) is not int or version != FORMAT_VERSION:
        raise StaleCacheError(
            f"avatar {directory.name!r} has cache format {version!r}, this version reads format {FORMAT_VERSION}; "
            f"rebuild it: {rebuild_command(manifest, directory.name)}"
        )
    check_manifest(manifest, str(directory / MANIFEST))
    return manifest


def rebuild_command(manifest: Mapping[str, Any], name: str, checkpoints: str | Path | None = None) -> str:
    """The CLI line that registers this avatar again, each argument shell-quoted: the source path comes from a manifest
    the user may have been handed, and a line pasted into a shell must not run what a path spells."""
    source_info = manifest.get("source")
    path = source_info.get("path") if isinstance(source_info, dict) else None
    source = shlex.quote(path) if isinstance(path, str) and path.isprintable() else "PORTRAIT"
    ckpt = shlex.quote(str(checkpoints)) if checkpoints is not None else "CHECKPOINTS_DIR"
    return f"python -m apps.avatars register {source} --name {shlex.quote(name)} --checkpoints {ckpt}"


def load_avatar(
    name_or_path: str | Path,
    device: str | torch.device = "cpu",
    *,
    checkpoints: str | Path | Mapping[str, str] | None = None,
    cache_dir: str | Path | None = None,
    verify: bool = True,
) -> Avatar:
    """Load a cached avatar with its tensors on ``device``.

    ``checkpoints`` (a folder, or a name -> sha256 mapping) must be the ones the avatar was
    registered with, else StaleCacheError; ``verify`` checks the tensor file's CRC-32.
    """
    directory = resolve(name_or_path, cache_dir)
    manifest = read_manifest(directory)
    name = manifest["name"]
    if checkpoints is not None:
        _check_checkpoints(manifest, name, checkpoints)
    info = manifest["tensors"]
    if info["file"] != TENSORS:
        raise CacheError(f"{directory / MANIFEST} is corrupted (no tensor entry); register the avatar again")
    data = _read_tensor_file(directory / TENSORS)
    if data.size != info["bytes"] or (verify and zlib.crc32(data) != info["crc32"]):
        raise CacheError(
            f"{directory / TENSORS} is corrupted (size or checksum differs from the manifest); "
            f"rebuild it: {rebuild_command(manifest, name)}"
        )
    tensors = _parse_safetensors(data, torch.device(device), directory / TENSORS)
    check_tensors(manifest, tensors, str(directory))
    return Avatar(name=name, is_image=manifest["is_image"], manifest=manifest, **tensors)


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading only if it is a regular file: a FIFO or a device handed as a cache file would block
    the load for ever (or never end), so it is opened without blocking and checked before anything is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    file = open(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        file.close()
        raise CacheError(f"{path} is not a regular file; register the avatar again")
    return file


def _read_tensor_file(path: Path) -> np.ndarray:
    """The tensor file's bytes (CacheError when it is missing or not a regular file)."""
    try:
        file = _open_regular(path)
    except FileNotFoundError as exc:
        raise CacheError(f"{path.parent}: {TENSORS} is missing; register the avatar again") from exc
    with file:
        return np.fromfile(file, dtype=np.uint8)


def _check_checkpoints(manifest: Mapping[str, Any], name: str, checkpoints: str | Path | Mapping[str, str]) -> None:
    """Refuse an avatar registered with other checkpoints than ``checkpoints``."""
    here = dict(checkpoints) if isinstance(checkpoints, Mapping) else checkpoint_hashes(checkpoints)
    recorded = manifest["checkpoints"]["sha256"]
    differing = [n for n in REGISTRATION_NETWORKS if recorded.get(n) != here.get(n)]
    if differing:
        where = checkpoints if not isinstance(checkpoints, Mapping) else None
        raise StaleCacheError(
            f"avatar {name!r} was registered with other checkpoints ({', '.join(differing)} differ: "
            f"{str(recorded.get(differing[0]))[:12]}... in the cache, {str(here.get(differing[0]))[:12]}... now); "
            f"rebuild it: {rebuild_command(manifest, name, where)}"
        )


def _check_shapes(found: Mapping[str, tuple[str, tuple[int, ...]]], what: str) -> None:
    """Check every tensor's dtype and shape against the cache layout (N, H, W consistent)."""
    sizes: dict[str, int] = {}
    for key, (dtype, spec) in _TENSOR_SPEC.items():
        if key not in found:
            raise CacheError(f"{what}: tensor {key!r} is missing")
        got_dtype, shape = found[key]
        if got_dtype not in _DTYPE_NAMES[dtype] or len(shape) != len(spec):
            raise CacheError(f"{what}: tensor {key!r} is {got_dtype}{list(shape)}, expected {dtype}{list(spec)}")
        for dim, want_dim in zip(shape, spec):
            if isinstance(want_dim, str):
                want_dim = sizes.setdefault(want_dim, int(dim))
            if int(dim) != want_dim or int(dim) <= 0:
                raise CacheError(f"{what}: tensor {key!r} has shape {list(shape)}, expected {list(spec)} ({sizes})")


def _parse_safetensors(data: np.ndarray, device: torch.device, path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file already in memory, on ``device``, as views of one device buffer."""
    corrupt = f"{path} is corrupted"
    if data.size < 8:
        raise CacheError(f"{corrupt} (too short); register the avatar again")
    header_len = int(data[:8].view("<u8")[0])
    if header_len <= 0 or 8 + header_len > data.size:
        raise CacheError(f"{corrupt} (bad header length); register the avatar again")
    try:
        header = parse_json(data[8 : 8 + header_len].tobytes(), "a tensor header")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CacheError(f"{corrupt} (unreadable header: {exc}); register the avatar again") from exc
    if not isinstance(header, dict):
        raise CacheError(f"{corrupt} (header is not a JSON object); register the avatar again")
    header.pop("__metadata__", None)
    body_len = data.size - 8 - header_len
    entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for key, entry in header.items():
        try:
            itemsize = _DTYPES[entry["dtype"]][1]
            shape = tuple(entry["shape"])
            start, end = entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CacheError(f"{corrupt} (bad entry for {key!r}); register the avatar again") from exc
        if not all(type(v) is int and v >= 0 for v in (*shape, start, end)):
            raise CacheError(
                f"{corrupt} (bad entry for {key!r}: sizes and offsets are whole numbers ≥ 0); register the avatar again"
            )
        if not start <= end <= body_len or end - start != math.prod(shape) * itemsize or start % itemsize:
            raise CacheError(f"{corrupt} (entry {key!r} does not fit the file); register the avatar again")
        entries[key] = (entry["dtype"], shape, start, end)
    spans = sorted((start, end) for *_, start, end in entries.values())
    if [s for s, _ in spans] != [0] + [e for _, e in spans[:-1]] or (spans and spans[-1][1] != body_len):
        raise CacheError(f"{corrupt} (the entries overlap or leave gaps in the data); register the avatar again")
    _check_shapes({k: (e[0], e[1]) for k, e in entries.items()}, str(path))
    body = torch.from_numpy(data[8 + header_len :])
    if device.type != "cpu":
        body = body.to(device)
    return {
        key: body[start:end].view(_DTYPES[code][0]).view(shape)
        for key, (code, shape, start, end) in entries.items()
        if key in _TENSOR_SPEC
    }

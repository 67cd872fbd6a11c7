"""The JSON manifest beside every ONNX or plan directory: its format, and reading it safely.

A manifest records what built each file (checkpoint and ONNX sha256s, precision, profiles, I/O
names, shapes and dtypes, export and build settings, the builder and its version, the target
compute capabilities) so that a rebuild redoes only what changed and a loader refuses a plan
that cannot run here, naming the plans to rebuild. Plain JSON only: reading one runs no code
from the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.nesting import nested_over
from engine.plans.libraries import BUILDER_OPTIONS
from engine.plans.targets import parse_compute_capability

FORMAT_VERSION = 2
MANIFEST_FILE = "manifest.json"
ONNX_DIR = "onnx"
HARDWARE_COMPAT_LEVELS = ("none", "ampere+")
KINDS = ("onnx", "plans")

MAX_MANIFEST_BYTES = 16 << 20
"""A manifest larger than this is refused (a real one is a few KB)."""
MAX_DEPTH = 10
"""JSON nested deeper than this is refused (a manifest nests six levels: graphs, entry, io, inputs, tensor, shape)."""
TENSOR_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")
"""The dtypes a plan's I/O may name (each a torch attribute of that name)."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ValueError):
    """A manifest file is missing, unreadable or not in this format."""


@dataclass
class GraphEntry:
    """One ONNX graph or plan: its file, hash, and everything that determined its contents."""

    file: str
    sha256: str
    checkpoints: dict[str, str]
    precision: str
    profiles: dict[str, list[list[int]]]
    settings: dict[str, Any]
    onnx_sha256: str | None = None
    built_at: str = ""
    seconds: float = 0.0
    io: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Plans only: {"inputs": [...], "outputs": [...]}, each {"name", "shape" (-1 dynamic), "dtype"}."""

    def same_recipe(self, other: GraphEntry) -> bool:
        """True when both were made from the same inputs the same way (file, hash and time aside)."""
        keys = ("checkpoints", "precision", "settings", "onnx_sha256")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


@dataclass
class Manifest:
    """A directory of ONNX graphs (``kind="onnx"``) or of plans from one builder for a set of GPUs.

    ``compute_capabilities`` are the targets (``sm_XY``) the plans were built for; ``gpu_name``
    is the GPU that built them, when the builder needed one (full TensorRT).
    """

    kind: str
    checkpoints_dir: str
    builder: str | None = None
    builder_version: str | None = None
    compute_capabilities: list[str] = field(default_factory=list)
    gpu_name: str | None = None
    hardware_compat: str = "none"
    build_flags: dict[str, Any] = field(default_factory=dict)
    graphs: dict[str, GraphEntry] = field(default_factory=dict)
    created: str = ""
    format: int = FORMAT_VERSION


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_TOP_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": int,
    "kind": str,
    "checkpoints_dir": str,
    "builder": (str, type(None)),
    "builder_version": (str, type(None)),
    "compute_capabilities": list,
    "gpu_name": (str, type(None)),
    "hardware_compat": str,
    "build_flags": dict,
    "graphs": dict,
    "created": str,
}
_ENTRY_TYPES: dict[str, type | tuple[type, ...]] = {
    "file": str,
    "sha256": str,
    "checkpoints": dict,
    "precision": str,
    "profiles": dict,
    "settings": dict,
    "onnx_sha256": (str, type(None)),
    "built_at": str,
    "seconds": (int, float),
    "io": dict,
}


def read_manifest(directory: str | Path) -> Manifest:
    """Read and validate ``directory/manifest.json``; every problem is a ManifestError naming the file."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"{path} not found: {directory} was not written by python -m compile.build_plans")
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"over {MAX_MANIFEST_BYTES >> 20} MB")
        raw = json.loads(path.read_text())
        if nested_over(raw, MAX_DEPTH):
            raise ValueError(f"nested more than {MAX_DEPTH} deep")
    except RecursionError:
        raise ManifestError(f"{path} is not readable JSON (nested too deep); delete {directory} and rebuild") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"{path} is not readable JSON ({exc}); delete {directory} and rebuild") from exc
    _check_fields(path, "the manifest", raw, _TOP_TYPES)
    if not _printable(raw["checkpoints_dir"]):
        raise ManifestError(f"{path}: field 'checkpoints_dir' is {_shown(raw['checkpoints_dir'])}, not a printable "
                            "path")
    if not isinstance(raw["build_flags"].get("grid_sample"), (str, type(None))):
        raise ManifestError(f"{path}: field 'build_flags' has grid_sample "
                            f"{_shown(raw['build_flags']['grid_sample'])}, not a name")
    if raw["format"] != FORMAT_VERSION:
        raise ManifestError(f"{path} has format {raw['format']}, this code reads format {FORMAT_VERSION}; rebuild")
    if raw["kind"] not in KINDS:
        raise ManifestError(f"{path}: kind {raw['kind']!r} is not one of {KINDS}")
    if raw["hardware_compat"] not in HARDWARE_COMPAT_LEVELS:
        raise ManifestError(
            f"{path}: hardware_compat {raw['hardware_compat']!r} is not one of {HARDWARE_COMPAT_LEVELS}"
        )
    if raw["builder"] not in (None, *BUILDER_OPTIONS):
        raise ManifestError(f"{path}: builder {raw['builder']!r} is not one of {sorted(BUILDER_OPTIONS)}")
    for name in raw["compute_capabilities"]:
        try:
            parse_compute_capability(name)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ManifestError(f"{path}: compute capability {_shown(name)} is not sm_XY") from exc
    graphs = {}
    for name, entry in raw["graphs"].items():
        if not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?", name) or len(name) > 64:
            raise ManifestError(f"{path}: graph {_shown(name)} is not a graph name (letters, digits, '_', one '.': "
                                "decoder.fp16)")
        _check_fields(path, f"graph {name!r}", entry, _ENTRY_TYPES)
        _check_entry(path, f"graph {name!r}", entry, raw["kind"])
        graphs[name] = GraphEntry(**entry)
    return Manifest(**{**raw, "graphs": graphs})


def _check_fields(path: Path, what: str, raw: Any, types: Mapping[str, type | tuple[type, ...]]) -> None:
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: {what} is a {type(raw).__name__}, not a JSON object")
    missing = [k for k in types if k not in raw]
    unknown = [k for k in raw if k not in types]
    if missing or unknown:
        raise ManifestError(f"{path}: {what} lacks {missing} / has unknown fields {unknown}; rebuild it")
    for key, expected in types.items():
        if not isinstance(raw[key], expected) or isinstance(raw[key], bool):
            raise ManifestError(f"{path}: {what} field {key!r} is {_shown(raw[key])}, of the wrong type")


def _check_entry(path: Path, what: str, entry: dict[str, Any], kind: str) -> None:
    """ManifestError naming the first field of a graph entry that is not what build_plans writes."""
    published = kind == "onnx" and entry["settings"].get("source") == "published" and Path(entry["file"]).is_absolute()
    checks: dict[str, tuple[bool, str]] = {
        "file": (_printable(entry["file"]) and (published or _plain_name(entry["file"])),
                 "a file name in the manifest's folder (ONNX manifests: or the absolute path of a published graph)"),
        "sha256": (_HEX64.match(entry["sha256"]) is not None or (kind == "onnx" and entry["sha256"] == ""), "64 hex digits"),
        "onnx_sha256": (entry["onnx_sha256"] is None or _HEX64.match(entry["onnx_sha256"]) is not None, "64 hex digits or null"),
        "checkpoints": (all(_printable(k) and isinstance(v, str) and _HEX64.match(v) for k, v in entry["checkpoints"].items()),
                        "checkpoint file names mapped to 64 hex digits"),
        "precision": (_printable(entry["precision"]) and len(entry["precision"]) <= 32, "a precision name such as "
                                                                                        "fp16"),
        "profiles": (all(_printable(k) and _shapes(v, 3) for k, v in entry["profiles"].items()),
                     "input names mapped to [min, opt, max] shapes of whole numbers"),
        "io": (_io(entry["io"]), f"{{inputs, outputs}}: lists of {{name, shape, dtype}}, dtype one of "
                                 f"{', '.join(TENSOR_DTYPES)}"),
        "built_at": (_printable(entry["built_at"]) and len(entry["built_at"]) <= 64, "a printable time stamp"),
        "seconds": (math.isfinite(entry["seconds"]) and entry["seconds"] >= 0, "seconds ≥ 0"),
    }
    for key, (good, accepted) in checks.items():
        if not good:
            raise ManifestError(f"{path}: {what} field {key!r} is {_shown(entry[key])}, not {accepted}; rebuild it")


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _printable(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 4096 and value.isprintable()


def _shapes(value: Any, count: int) -> bool:
    """``count`` shapes, each a list of at most 8 whole numbers ≥ -1 (-1: dynamic)."""
    return isinstance(value, list) and len(value) == count and all(_shape(s) for s in value)


def _shape(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 8 and all(type(d) is int and d >= -1 for d in value)


def _io(value: dict[str, Any]) -> bool:
    """A plan's I/O as build_plans records it (ONNX entries record none)."""
    return set(value) <= {"inputs", "outputs"} and all(
        isinstance(tensors, list) and all(
            isinstance(t, dict) and set(t) == {"name", "shape", "dtype"} and _printable(t["name"])
            and _shape(t["shape"]) and t["dtype"] in TENSOR_DTYPES
            for t in tensors
        )
        for tensors in value.values()
    )


def _shown(value: Any) -> str:
    """``value`` for a message, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def plan_dirs(root: str | Path) -> list[Path]:
    """The plan directories under ``root`` (or ``root`` itself when it holds a plan manifest), by name."""
    root = Path(root)
    if (root / MANIFEST_FILE).is_file():
        return [root]
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.name != ONNX_DIR and (d / MANIFEST_FILE).is_file())

"""The JSON manifest beside every ONNX or plan directory, and the checks a loader runs against it.

A manifest records what built each file (checkpoint and ONNX sha256s, precision, profiles,
export and build settings, TensorRT version, GPU) so that a rebuild redoes only what changed
and a loader refuses a plan for another GPU or TensorRT, naming the plans to rebuild.
Plain JSON only: reading one runs no code from the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engine.backends.base import BackendError

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
ONNX_DIR = "onnx"
HARDWARE_COMPAT_LEVELS = ("none", "ampere+")
KINDS = ("onnx", "plans")


class ManifestError(ValueError):
    """A manifest file is missing, unreadable or not in this format."""


class PlanMismatch(BackendError):
    """Plans that exist but do not fit this machine or these checkpoints; the message names what to rebuild."""


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

    def same_recipe(self, other: GraphEntry) -> bool:
        """True when both were made from the same inputs the same way (file, hash and time aside)."""
        keys = ("checkpoints", "precision", "settings", "onnx_sha256")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


@dataclass
class Manifest:
    """A directory of ONNX graphs (``kind="onnx"``) or of TensorRT plans for one GPU and TensorRT version."""

    kind: str
    checkpoints_dir: str
    tensorrt_version: str | None = None
    compute_capability: str | None = None
    gpu_name: str | None = None
    hardware_compat: str = "none"
    build_flags: dict[str, Any] = field(default_factory=dict)
    graphs: dict[str, GraphEntry] = field(default_factory=dict)
    created: str = ""
    format: int = FORMAT_VERSION


def now_iso() -> str:
    """The current UTC time, to the second, as ISO 8601."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def compute_capability_name(major: int, minor: int) -> str:
    """``sm_XY`` as CUDA spells it: (8, 9) -> sm_89, (12, 0) -> sm_120."""
    return f"sm_{major}{minor}"


def parse_compute_capability(name: str) -> tuple[int, int]:
    """(major, minor) of an ``sm_XY`` name; the last digit is the minor version."""
    digits = name.removeprefix("sm_")
    if not name.startswith("sm_") or not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"not a compute capability: {name!r} (expected sm_XY, e.g. sm_89 or sm_120)")
    return int(digits[:-1]), int(digits[-1])


def plan_dir_name(compute_capability: str, tensorrt_version: str, hardware_compat: str = "none") -> str:
    """``sm_89-trt10.8.0``, or ``ampere_plus-trt10.8.0`` for hardware-compatible plans."""
    target = "ampere_plus" if hardware_compat == "ampere+" else compute_capability
    return f"{target}-trt{tensorrt_version}"


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (a reader never sees half a file)."""
    path = Path(directory) / MANIFEST_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


_TOP_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": int,
    "kind": str,
    "checkpoints_dir": str,
    "tensorrt_version": (str, type(None)),
    "compute_capability": (str, type(None)),
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
}


def read_manifest(directory: str | Path) -> Manifest:
    """Read and validate ``directory/manifest.json``; every problem is a ManifestError naming the file."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"{path} not found: {directory} was not written by python -m compile.build_plans")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} is not readable JSON ({exc}); delete {directory} and rebuild") from exc
    _check_fields(path, "the manifest", raw, _TOP_TYPES)
    if raw["format"] != FORMAT_VERSION:
        raise ManifestError(f"{path} has format {raw['format']}, this code reads format {FORMAT_VERSION}; rebuild")
    if raw["kind"] not in KINDS:
        raise ManifestError(f"{path}: kind {raw['kind']!r} is not one of {KINDS}")
    if raw["hardware_compat"] not in HARDWARE_COMPAT_LEVELS:
        raise ManifestError(
            f"{path}: hardware_compat {raw['hardware_compat']!r} is not one of {HARDWARE_COMPAT_LEVELS}"
        )
    graphs = {}
    for name, entry in raw["graphs"].items():
        _check_fields(path, f"graph {name!r}", entry, _ENTRY_TYPES)
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
            raise ManifestError(f"{path}: {what} field {key!r} is {raw[key]!r}, of the wrong type")


def rebuild_command(manifest: Manifest, graphs: Iterable[str] | None = None, out: str | Path | None = None) -> str:
    """The build_plans command line that rebuilds ``graphs`` (all when None) for this manifest's target."""
    parts = ["python -m compile.build_plans", f"--checkpoints {manifest.checkpoints_dir}"]
    if graphs is not None:
        parts.append("--networks " + " ".join(sorted(graphs)))
    if out is not None:
        parts.append(f"--out {out}")
    if manifest.hardware_compat != "none":
        parts.append(f"--hardware-compat {manifest.hardware_compat}")
    grid_sample = manifest.build_flags.get("grid_sample")
    if grid_sample not in (None, "gather"):
        parts.append(f"--grid-sample {grid_sample}")
    return " ".join(parts)


def check_plans(
    directory: str | Path,
    manifest: Manifest,
    *,
    tensorrt_version: str,
    compute_capability: tuple[int, int],
    gpu_name: str,
    graphs: Iterable[str],
    checkpoint_sha256: Mapping[str, str] | None = None,
    verify_files: bool = True,
) -> None:
    """Raise PlanMismatch unless every plan in ``graphs`` loads here: same TensorRT, a fitting GPU,
    the same checkpoints (when their hashes are given), and plan files as built."""
    directory = Path(directory)
    out = directory.parent
    here = compute_capability_name(*compute_capability)
    if manifest.kind != "plans":
        raise PlanMismatch(
            f"{directory} holds ONNX graphs, not TensorRT plans: build plans with {rebuild_command(manifest, out=out)}"
        )
    if manifest.tensorrt_version != tensorrt_version:
        raise PlanMismatch(
            f"the plans in {directory} were built with TensorRT {manifest.tensorrt_version}, this machine has "
            f"TensorRT {tensorrt_version}; a plan only loads in the TensorRT version that built it. "
            f"Rebuild all plans: {rebuild_command(manifest, out=out)}"
        )
    if manifest.hardware_compat == "ampere+":
        if compute_capability[0] < 8:
            raise PlanMismatch(
                f"the plans in {directory} are hardware-compatible for Ampere and newer GPUs (sm_80+); "
                f"this GPU ({gpu_name}) is {here}. Build plans on this GPU without --hardware-compat."
            )
    elif manifest.compute_capability != here:
        raise PlanMismatch(
            f"the plans in {directory} were built for {manifest.compute_capability} ({manifest.gpu_name}); this GPU "
            f"({gpu_name}) is {here}. TensorRT plans run on the GPU architecture that built them: rebuild all plans "
            f"on this machine ({rebuild_command(manifest, out=out)}), or build once with --hardware-compat ampere+ "
            f"for plans that run on any Ampere-or-newer GPU"
        )
    problems: dict[str, str] = {}
    for name in graphs:
        entry = manifest.graphs.get(name)
        if entry is None:
            problems[name] = f"{name}: no plan in {directory}"
            continue
        plan = directory / entry.file
        if verify_files and not plan.is_file():
            problems[name] = f"{name}: {plan} is missing"
        elif verify_files and file_sha256(plan) != entry.sha256:
            problems[name] = f"{name}: {plan} differs from the file the manifest records (sha256 changed)"
        for file, sha in entry.checkpoints.items():
            if checkpoint_sha256 is not None and file in checkpoint_sha256 and checkpoint_sha256[file] != sha:
                problems[name] = (
                    f"{name}: {entry.file} was built from a {file} with sha256 {sha[:12]}…, "
                    f"the checkpoint here has {checkpoint_sha256[file][:12]}…"
                )
    if problems:
        lines = "\n  ".join(problems[n] for n in sorted(problems))
        raise PlanMismatch(
            f"plans to rebuild in {directory}:\n  {lines}\n"
            f"rebuild them: {rebuild_command(manifest, problems, out=out)}"
        )


def find_plan_dir(root: str | Path, compute_capability: str, tensorrt_version: str) -> Path | None:
    """The plan directory to load: ``root`` itself when it holds a manifest, else the one for this GPU
    and TensorRT under ``root``, else a hardware-compatible one for this TensorRT (Ampere and newer)."""
    root = Path(root)
    if (root / MANIFEST_FILE).is_file():
        return root
    candidates = [plan_dir_name(compute_capability, tensorrt_version)]
    if parse_compute_capability(compute_capability)[0] >= 8:
        candidates.append(plan_dir_name(compute_capability, tensorrt_version, "ampere+"))
    for name in candidates:
        if (root / name / MANIFEST_FILE).is_file():
            return root / name
    return None

"""Writing the manifest of an ONNX or plan directory (its format and reading it: ``engine.plans.manifest``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from engine.plans.libraries import RTX
from engine.plans.manifest import MANIFEST_FILE, Manifest


def now_iso() -> str:
    """The current UTC time, to the second, as ISO 8601."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def plan_dir_name(
    builder: str, version: str, compute_capabilities: Iterable[str], hardware_compat: str = "none"
) -> str:
    """``rtx1.7.1.116`` for TensorRT-RTX (one plan set serves all its targets, listed in the manifest);
    ``sm_89-trt10.8.0``, or ``ampere_plus-trt10.8.0`` for hardware-compatible plans, for full TensorRT."""
    targets = list(compute_capabilities)
    if builder == RTX:
        return f"rtx{version}"
    target = "ampere_plus" if hardware_compat == "ampere+" else targets[0]
    return f"{target}-trt{version}"


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (a reader never sees half a file)."""
    path = Path(directory) / MANIFEST_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path

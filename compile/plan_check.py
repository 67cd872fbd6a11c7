"""``python -m compile.build_plans --check PLANS``: for each plan, can it run on this machine, and why not.

It reads the manifests (targets, builder version), compares each plan file with the hash its
manifest records, and asks the builder's runtime about the plan's header
(``Runtime.get_engine_validity``, TensorRT-RTX), which reads the header only and loads nothing.
Without a GPU the runtime can tell a well-formed plan header from a malformed one, not more.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.plans.checks import rebuild_command, why_not_here
from engine.plans.libraries import BUILDER_TITLES, FULL, MODULES, RTX
from engine.plans.manifest import ManifestError, file_sha256, plan_dirs, read_manifest
from engine.plans.targets import GpuInfo, describe, describe_all

# EngineInvalidityDiagnostics bits of TensorRT-RTX, in words.
_DIAGNOSTICS = {
    "VERSION_MISMATCH": "it was built by another TensorRT-RTX version",
    "UNSUPPORTED_CC": "it was not built for this GPU's compute capability",
    "OLD_CUDA_DRIVER": "the CUDA driver here is too old for it",
    "OLD_CUDA_RUNTIME": "the CUDA runtime here is too old for it",
    "INSUFFICIENT_GPU_MEMORY": "this GPU has too little memory for it",
    "MALFORMED_ENGINE": "its header is not a TensorRT-RTX plan header (damaged or not a plan)",
    "CUDA_ERROR": "CUDA failed while checking it",
}


def diagnostics_in_words(trt: ModuleType, flags: int) -> list[str]:
    """The reasons an EngineInvalidityDiagnostics bit mask gives, in plain words."""
    bits = trt.EngineInvalidityDiagnostics
    return [words for name, words in _DIAGNOSTICS.items() if flags & int(getattr(bits, name))]


def _quiet_logger(trt: ModuleType) -> Any:
    """A logger that keeps TensorRT's messages (without a GPU it logs its failed GPU query as fatal)."""

    class Quiet(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            self.messages.append(msg)

    return Quiet()


def header_verdict(trt: ModuleType, header: bytes, gpu: GpuInfo | None) -> tuple[bool, str]:
    """(whether the header says the plan runs here, what it says in words), from the plan's first bytes."""
    runtime = trt.Runtime(_quiet_logger(trt))
    validity, flags = runtime.get_engine_validity(header[: runtime.engine_header_size])
    reasons = diagnostics_in_words(trt, int(flags))
    if gpu is None:
        if reasons:
            return False, "; ".join(reasons)
        return False, "reads as a TensorRT-RTX plan; only a GPU can tell whether it runs"
    if validity == trt.EngineValidity.VALID:
        return True, "the header says it runs on this GPU"
    if validity == trt.EngineValidity.SUBOPTIMAL:
        return True, "the header says it runs on this GPU, possibly slower than on its targets"
    return False, "; ".join(reasons) or "the header says it cannot run here"


def check_directory(directory: Path, gpu: GpuInfo | None, installed: Mapping[str, str]) -> tuple[list[str], bool]:
    """The report lines for one plan directory, and whether every plan in it can run here."""
    try:
        manifest = read_manifest(directory)
    except ManifestError as exc:
        return [f"{directory}: {exc}"], False
    if manifest.kind != "plans":
        build = rebuild_command(manifest, out=directory.parent)
        return [
            f"{directory}: holds ONNX graphs, not plans; build plans from them: {build}, then --check "
            f"{directory.parent}"
        ], False
    title = BUILDER_TITLES[manifest.builder or FULL]
    targets = describe_all(manifest.compute_capabilities) if manifest.compute_capabilities else "an unrecorded GPU"
    lines = [f"{directory}: {title} {manifest.builder_version} plans for {targets}; built {manifest.created}"]
    reason = why_not_here(manifest, gpu, installed)
    lines.append(f"  this machine {'can run them' if reason is None else 'cannot run them: ' + reason}")
    trt = _runtime_module(manifest.builder, installed)
    all_ok = reason is None
    for name, entry in sorted(manifest.graphs.items()):
        path = directory / entry.file
        ok, notes = reason is None, [] if reason is None else ["see above"]
        if not path.is_file():
            ok, notes = False, [f"{path} is missing"]
        elif file_sha256(path) != entry.sha256:
            ok, notes = False, ["the file differs from the one its manifest records (sha256): rebuild it"]
        elif trt is not None and hasattr(trt.Runtime, "get_engine_validity"):
            with open(path, "rb") as f:
                header_ok, said = header_verdict(trt, f.read(4096), gpu)
            ok &= header_ok
            notes.append(f"header: {said}")
        size = f"{path.stat().st_size / 1e6:7.1f} MB" if path.is_file() else "   missing"
        verdict = "can run here" if ok else "cannot run here"
        detail = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"  {name:22s} {entry.precision:5s} {size}  {verdict}{detail}")
        all_ok &= ok
    return lines, all_ok


def _runtime_module(builder: str | None, installed: Mapping[str, str]) -> ModuleType | None:
    if builder not in installed:
        return None
    return importlib.import_module(MODULES[builder or RTX])


def check_report(root: str | Path, gpu: GpuInfo | None, installed: Mapping[str, str]) -> tuple[list[str], bool]:
    """Report lines for every plan directory at or under ``root``, and whether all their plans run here."""
    directories = plan_dirs(root)
    if not directories:
        return [f"{root}: no plan directory (one with a manifest.json written by python -m compile.build_plans)"], False
    gpu_line = "no CUDA GPU" if gpu is None else f"{gpu.name}, {describe(gpu.arch)}"
    builders = ", ".join(f"{BUILDER_TITLES[b]} {v}" for b, v in sorted(installed.items())) or "no TensorRT library"
    lines, all_ok = [f"this machine: {gpu_line}; {builders}"], True
    for directory in directories:
        report, ok = check_directory(directory, gpu, installed)
        lines += report
        all_ok &= ok
    return lines, all_ok

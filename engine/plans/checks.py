"""The checks a loader runs on a plan directory before loading it, and the command that rebuilds what fails them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from engine.backends.base import BackendError
from engine.plans.libraries import BUILDER_OPTIONS, BUILDER_TITLES, FULL, INSTALL, RTX, RTX_TARGETS
from engine.plans.manifest import Manifest, file_sha256
from engine.plans.targets import GpuInfo, describe, describe_all


class PlanMismatch(BackendError):
    """Plans that exist but do not fit this machine or these checkpoints; the message names what to rebuild."""


def rebuild_command(manifest: Manifest, graphs: Iterable[str] | None = None, out: str | Path | None = None) -> str:
    """The build_plans command line that rebuilds ``graphs`` (all when None) for this manifest's target."""
    parts = ["python -m compile.build_plans", f"--checkpoints {manifest.checkpoints_dir}"]
    if graphs is not None:
        parts.append("--networks " + " ".join(sorted(graphs)))
    if out is not None:
        parts.append(f"--out {out}")
    if manifest.builder is not None:
        parts.append(f"--builder {BUILDER_OPTIONS[manifest.builder]}")
    if manifest.builder == RTX and manifest.compute_capabilities:
        parts.append("--arch " + " ".join(manifest.compute_capabilities))
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
    graphs: Iterable[str],
    checkpoint_sha256: Mapping[str, str] | None = None,
    verify_files: bool = True,
) -> None:
    """Raise PlanMismatch unless every plan in ``graphs`` is there as built, from the same checkpoints
    (when their hashes are given). Whether the plans suit this GPU is ``engine.plans.targets``' question."""
    directory = Path(directory)
    out = directory.parent
    if manifest.kind != "plans":
        raise PlanMismatch(
            f"{directory} holds ONNX graphs, not TensorRT plans: build plans with {rebuild_command(manifest, out=out)}"
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


def alternatives(checkpoints: str) -> str:
    """What to run instead of TensorRT-RTX plans, for a GPU they cannot run on."""
    return (
        "Run with --backend torch instead (any CUDA GPU, and the CPU), or build full-TensorRT plans on "
        f"this machine: {INSTALL[FULL]}, then python -m compile.build_plans --builder tensorrt "
        f"--checkpoints {checkpoints}"
    )


def why_not_here(manifest: Manifest, gpu: GpuInfo | None, installed: Mapping[str, str]) -> str | None:
    """None when the plans of ``manifest`` can run on ``gpu`` with the ``installed`` builders, else why not."""
    if manifest.kind != "plans":
        return "it holds ONNX graphs, not plans"
    if manifest.builder == RTX:
        reason = _rtx_gpu_problem(manifest, gpu)
    else:
        reason = _full_gpu_problem(manifest, gpu)
    return reason or _version_problem(manifest, installed)


def _rtx_gpu_problem(manifest: Manifest, gpu: GpuInfo | None) -> str | None:
    targets = manifest.compute_capabilities
    supported = describe_all(targets)
    if gpu is None:
        return (
            f"this machine has no CUDA GPU; these TensorRT-RTX plans run on GPUs of {supported}. "
            "Without a GPU the engine runs with --backend torch (on the CPU, slowly)"
        )
    if gpu.arch in targets:
        return None
    if gpu.arch in RTX_TARGETS:
        return (
            f"this GPU, {gpu.name}, has {describe(gpu.arch)}; the plans were built for {supported} only. "
            f"Rebuild them with --arch {' '.join([*targets, gpu.arch])} (no GPU is needed to build)"
        )
    return (
        f"this GPU, {gpu.name}, has {describe(gpu.arch)}, which TensorRT-RTX does not run on; these plans run "
        f"on {supported}. {alternatives(manifest.checkpoints_dir)}"
    )


def _full_gpu_problem(manifest: Manifest, gpu: GpuInfo | None) -> str | None:
    built_for = manifest.compute_capabilities[0] if manifest.compute_capabilities else "an unknown GPU"
    if gpu is None:
        return (
            f"this machine has no CUDA GPU; full-TensorRT plans run on the GPU that built them ({built_for}, "
            f"{manifest.gpu_name}). Without a GPU the engine runs with --backend torch"
        )
    if manifest.hardware_compat == "ampere+":
        if gpu.major >= 8:
            return None
        return (
            f"the plans are hardware-compatible for Ampere and newer GPUs (sm_80+); this GPU ({gpu.name}) is "
            f"{gpu.arch}. Build plans on this GPU without --hardware-compat."
        )
    if built_for == gpu.arch:
        return None
    return (
        f"the plans were built for {built_for} ({manifest.gpu_name}); this GPU ({gpu.name}) is {gpu.arch}. "
        "Full-TensorRT plans run on the GPU architecture that built them: rebuild them on this machine, or "
        "build once with --hardware-compat ampere+ for plans that run on any Ampere-or-newer GPU"
    )


def _version_problem(manifest: Manifest, installed: Mapping[str, str]) -> str | None:
    builder = manifest.builder or FULL
    title = BUILDER_TITLES[builder]
    have = installed.get(builder)
    if have == manifest.builder_version:
        return None
    pin = f"pip install {'tensorrt-rtx-cu13' if builder == RTX else 'tensorrt'}=={manifest.builder_version}"
    if have is None:
        return f"{title} is not installed here; the plans need {title} {manifest.builder_version}: {pin}"
    return (
        f"the plans were built with {title} {manifest.builder_version}, this machine has {title} {have}; "
        f"a plan only loads in the {title} version that built it. Rebuild all plans, or {pin}"
    )

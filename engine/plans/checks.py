"""The checks a loader runs on a plan directory before loading it, and the command that rebuilds what fails them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from engine.backends.base import BackendError
from engine.plans.libraries import BUILDER_OPTIONS, RTX
from engine.plans.manifest import Manifest, file_sha256


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



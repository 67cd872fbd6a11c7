"""Build the torch backend's ahead-of-time compiled packages (torch.export + AOTInductor) for the device it runs on.

One package per call and batch bucket the runtime uses (``engine.backends.aot_calls``), each exported with static
shapes, as the runtime's CUDA graphs capture them, and compiled without its weights (the backend binds its own at
load, so the buckets share one copy), into ``PLANS/torch-aot-<arch>/`` with a manifest
(``engine.plans.packages``). A package whose recipe (target, steps, checkpoints) is unchanged and whose file
still hashes to its manifest entry is kept, so a rebuild redoes only what changed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm import tqdm

from engine.backends.aot_calls import PrepareCall, RenderCall, StepCall, module_tensors, prepare_inputs, render_inputs, step_inputs
from engine.backends.torch_backend import TorchBackend
from engine.diffusion.schedule import ddim_schedule
from engine.networks import OFFICIAL_FILENAMES
from engine.networks.lmdm_fused import FusedLMDMStep
from engine.plans.manifest import file_sha256
from engine.plans.packages import (
    CALLS,
    MANIFEST_FILE,
    Package,
    PackageManifest,
    StalePackages,
    Target,
    networks_of,
    read_manifest,
    weights_digest,
)

WEIGHTS_OUTSIDE = {"aot_inductor.package_constants_in_so": False}
"""AOTInductor's setting for a package that holds no weights (they are bound at load: ``engine.plans.packages``)."""


def build_packages(
    backend: TorchBackend,
    checkpoints: Path,
    plans: Path,
    steps: int,
    window_buckets: Iterable[int],
    render_buckets: Iterable[int],
    calls: Iterable[str] = CALLS,
    progress: bool = True,
) -> PackageManifest:
    """Export and compile ``calls`` of ``backend`` (loaded from ``checkpoints``) at each bucket into ``plans``; returns
    the manifest written. LMDM calls use ``window_buckets``, the render ``render_buckets``."""
    calls = tuple(calls)
    unknown = set(calls) - set(CALLS)
    if unknown:
        raise ValueError(f"unknown call(s) {sorted(unknown)}: choose from {', '.join(CALLS)}")
    target = Target.here(backend.device, backend.dtype)
    folder = Path(plans) / target.folder()
    folder.mkdir(parents=True, exist_ok=True)
    networks = {name for call in calls for name in networks_of(call)}
    hashes = {name: file_sha256(checkpoints / OFFICIAL_FILENAMES[name]) for name in sorted(networks)}
    manifest = PackageManifest(target, steps, hashes)
    kept = _reusable(folder, manifest)
    jobs = [(call, b) for call in calls for b in sorted(set(render_buckets if call == "render" else window_buckets))]
    schedule = ddim_schedule(steps, backend.device)
    fused = FusedLMDMStep(backend.network("lmdm"), backend.dtype) if "lmdm" in networks else None
    with tqdm(jobs, desc=f"compiling packages for {target.device}", unit="package", disable=not progress) as bar:
        for call, batch in bar:
            bar.set_postfix_str(f"{call} x{batch}")
            previous = kept.get((call, batch))
            if previous is not None:
                manifest.packages.append(previous)
                continue
            started = time.perf_counter()
            module, inputs = _call(backend, fused, schedule, call, batch)
            path = folder / f"{call}-b{batch}.pt2"
            with torch.no_grad():  # not inference mode: the LMDM step writes into its window, and compiling replays it
                exported = torch.export.export(module, inputs)
            # Without its weights: the package runs on the backend's modules' own tensors (one copy for every bucket).
            torch._inductor.aoti_compile_and_package(exported, package_path=str(path), inductor_configs=WEIGHTS_OUTSIDE)
            weights = weights_digest(module_tensors(module), torch._inductor.aoti_load_package(str(path)).get_constant_fqns())
            seconds = round(time.perf_counter() - started, 1)
            manifest.packages.append(Package(call, batch, path.name, file_sha256(path), seconds, weights))
    manifest.built_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (folder / MANIFEST_FILE).write_text(manifest.to_json())
    return manifest


def _call(backend: TorchBackend, fused: FusedLMDMStep | None, schedule, call: str, batch: int):
    """The module and example inputs of one call at one batch."""
    if call == "render":
        module = RenderCall(backend.network("warp_network"), backend.network("decoder"))
        return module, render_inputs(batch, backend.device, backend.dtype)
    with torch.no_grad():
        if call == "lmdm_prepare":
            return PrepareCall(fused), prepare_inputs(schedule, batch, backend.cond_width)
        return StepCall(fused), step_inputs(fused, schedule, batch, backend.cond_width)


def _reusable(folder: Path, manifest: PackageManifest) -> dict[tuple[str, int], Package]:
    """Packages of an existing manifest with the same recipe whose files still hash to their entries."""
    try:
        old = read_manifest(folder)
    except StalePackages:
        return {}
    if (old.target, old.steps) != (manifest.target, manifest.steps):
        return {}
    kept = {}
    for package in old.packages:
        same = all(old.checkpoints.get(n) == manifest.checkpoints.get(n) for n in networks_of(package.call))
        path = folder / package.file
        if same and path.is_file() and file_sha256(path) == package.sha256:
            kept[(package.call, package.batch)] = package
    return kept

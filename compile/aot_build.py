"""Build the torch backend's ahead-of-time compiled packages (torch.export + AOTInductor) for the device it runs on.

One package per call and batch bucket the runtime uses (``engine.backends.aot_calls``), each exported with static
shapes, as the runtime's CUDA graphs capture them, and compiled without its weights (the backend binds its own at
load, so the buckets share one copy), into ``PLANS/torch-aot-<arch>/`` with a manifest
(``engine.plans.packages``). A package whose recipe (target, steps, checkpoints) is unchanged and whose file
still hashes to its manifest entry is kept, so a rebuild redoes only what changed.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

from engine.backends.aot_calls import (
    PrepareCall,
    RenderCall,
    StepCall,
    module_tensors,
    prepare_inputs,
    render_inputs,
    step_inputs,
)
from engine.backends.torch_backend import TorchBackend
from engine.diffusion.schedule import ddim_schedule
from engine.networks import OFFICIAL_FILENAMES
from engine.networks.lmdm_fused import FusedLMDMStep
from engine.plans.manifest import file_sha256
from engine.plans.package_loader import without_cpu_isa_probe
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
    jobs: int = 1,
) -> PackageManifest:
    """Export and compile ``calls`` of ``backend`` (loaded from ``checkpoints``) at each bucket into ``plans``; returns
    the manifest written. LMDM calls use ``window_buckets``, the render ``render_buckets``. ``jobs`` > 1 compiles that
    many packages at once, each in a process of its own with its own copy of the networks."""
    calls = tuple(calls)
    unknown = set(calls) - set(CALLS)
    if unknown:
        raise ValueError(f"unknown call(s) {sorted(unknown)}: choose from {', '.join(CALLS)}")
    target = Target.here(backend.device, backend.dtype)
    folder = Path(plans) / target.folder()
    folder.mkdir(parents=True, exist_ok=True)
    networks = tuple(sorted({name for call in calls for name in networks_of(call)}))
    hashes = {name: file_sha256(checkpoints / OFFICIAL_FILENAMES[name]) for name in networks}
    manifest = PackageManifest(target, steps, hashes)
    kept = _reusable(folder, manifest)
    wanted = [(call, b) for call in calls for b in sorted(set(render_buckets if call == "render" else window_buckets))]
    todo = [job for job in wanted if job not in kept]
    built: dict[tuple[str, int], Package] = {}
    with tqdm(
        total=len(wanted),
        initial=len(wanted) - len(todo),
        desc=f"compiling packages for {target.device}",
        unit="package",
        disable=not progress,
    ) as bar:
        if jobs <= 1 or len(todo) <= 1:
            compiler = _Compiler(backend, steps, target)
            for call, batch in todo:
                bar.set_postfix_str(f"{call} x{batch}")
                built[(call, batch)] = compiler.compile(folder, call, batch)
                bar.update()
        else:
            context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
            setup = (checkpoints, str(backend.device), backend.dtype, networks, steps)
            with ProcessPoolExecutor(
                min(jobs, len(todo)), mp_context=context, initializer=_start_worker, initargs=setup
            ) as pool:
                futures = {pool.submit(_compile_in_worker, folder, call, batch): (call, batch) for call, batch in todo}
                for future in as_completed(futures):
                    built[futures[future]] = future.result()
                    bar.set_postfix_str("{} x{}".format(*futures[future]))
                    bar.update()
    manifest.packages = [kept.get(job) or built[job] for job in wanted]
    manifest.built_at = datetime.now(UTC).isoformat(timespec="seconds")
    (folder / MANIFEST_FILE).write_text(manifest.to_json())
    return manifest


class _Compiler:
    """Exports and compiles one call at one batch of a backend's networks into a package file."""

    def __init__(self, backend: TorchBackend, steps: int, target: Target) -> None:
        self.backend = backend
        self.target = target
        self.schedule = ddim_schedule(steps, backend.device)
        self.fused = FusedLMDMStep(backend.network("lmdm"), backend.dtype) if backend.cond_width else None

    def compile(self, folder: Path, call: str, batch: int) -> Package:
        started = time.perf_counter()
        module, inputs = _call(self.backend, self.fused, self.schedule, call, batch)
        path = folder / f"{call}-b{batch}.pt2"
        with torch.no_grad():  # not inference mode: the LMDM step writes into its window, and compiling replays it
            exported = torch.export.export(module, inputs)
        # Without its weights: the package runs on the backend's modules' own tensors (one copy for every bucket).
        # On a GPU torch is told the CPU has no vector ISA: the package has no CPU kernels for it to matter to.
        with without_cpu_isa_probe(self.target.device):
            torch._inductor.aoti_compile_and_package(exported, package_path=str(path), inductor_configs=WEIGHTS_OUTSIDE)
            names = torch._inductor.aoti_load_package(str(path)).get_constant_fqns()
        seconds = round(time.perf_counter() - started, 1)
        return Package(
            call, batch, path.name, file_sha256(path), seconds, weights_digest(module_tensors(module), names)
        )


_WORKER: _Compiler | None = None
"""A worker process's compiler (``build_packages`` with ``jobs`` > 1)."""


def _start_worker(checkpoints: Path, device: str, dtype: torch.dtype, networks: tuple[str, ...], steps: int) -> None:
    global _WORKER
    backend = TorchBackend(checkpoints, device=device, dtype=dtype, networks=networks, compile_networks=False)
    _WORKER = _Compiler(backend, steps, Target.here(backend.device, backend.dtype))


def _compile_in_worker(folder: Path, call: str, batch: int) -> Package:
    assert _WORKER is not None, "a worker compiles only after _start_worker"
    return _WORKER.compile(folder, call, batch)


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

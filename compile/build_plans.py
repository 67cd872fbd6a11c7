"""``python -m compile.build_plans``: turn Ditto checkpoints into ONNX graphs and TensorRT plans.

ONNX graphs go to ``<out>/onnx/`` with their manifest; FP16 plans are built from an FP16 graph
derived there and proven against PyTorch in onnxruntime first. Plans go to
``<out>/rtx<version>/`` (TensorRT-RTX, the default: built on any machine, no GPU needed, for
``--arch`` compute capabilities) or ``<out>/<sm_XY>-trt<version>/`` (full TensorRT, built on the
GPU that runs them), each directory with a JSON manifest. A second run redoes only what changed.
``--onnx-only`` needs no TensorRT; ``--check PLANS`` says for each plan whether it runs here. On a
CUDA GPU the torch backend's ahead-of-time compiled packages follow, into ``<out>/torch-aot-<sm_XY>/``
(``compile.aot_build``; ``--aot only`` builds just those, ``--aot no`` none).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from compile import fp16
from compile.aot_build import build_packages
from compile.export import (
    GRID_SAMPLE_OPSETS,
    ExportError,
    export_fp16,
    export_network,
    export_settings,
    graph_io,
    merge_warp_decoder,
)
from compile.manifest import now_iso, plan_dir_name, write_manifest
from compile.onnx_parity import FP16_TOLERANCE, onnx_vs_pytorch
from compile.plan_check import check_report
from compile.profiles import DEFAULT_GRAPHS, ProfileError, profile_shapes
from compile.trt_build import (
    BUILDER_CHOICES,
    BuildOptions,
    BuildTargetError,
    PlanBuildError,
    build_plan,
    check_target,
    choose_builder,
    rtx_targets,
)
from engine.audio.hubert import OFFICIAL_FILE as HUBERT_FILE
from engine.audio.hubert import find_official_hubert
from engine.backends.base import BackendError
from engine.backends.torch_backend import TorchBackend
from engine.buckets import RENDER_BUCKETS, WINDOW_BUCKETS
from engine.engine import models_dir
from engine.networks import OFFICIAL_FILENAMES, CheckpointError, write_random_checkpoints
from engine.plans import graphs
from engine.plans.graphs import SPECS, GraphSpec
from engine.plans.libraries import FULL, RTX, TensorRTUnavailable, import_builder, installed_builders
from engine.plans.manifest import ONNX_DIR, GraphEntry, Manifest, ManifestError, file_sha256, read_manifest
from engine.plans.targets import GpuInfo, parse_compute_capability, present_gpu
from engine.timebase import DEFAULT_STEPS

TIMING_CACHE = "timing.cache"
FP16_SUFFIX = ".fp16"


def _arch(value: str) -> str:
    try:
        parse_compute_capability(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m compile.build_plans",
        description="Export Ditto's networks to ONNX and build TensorRT plans (TensorRT-RTX: on any machine).",
    )
    add = parser.add_argument
    add(
        "--checkpoints",
        type=Path,
        help="the official download (its ditto_pytorch/models) or a folder of the six .pth files",
    )
    add(
        "--check",
        type=Path,
        metavar="PLANS",
        help="say for each plan under PLANS whether it can run on this machine, and why not; builds nothing",
    )
    add(
        "--networks",
        nargs="+",
        choices=sorted(SPECS),
        help="graphs to build (default: the six networks; warp_decoder, the merged warp+decode graph, and hubert, "
        "the published streaming HuBERT as a plan, only when named)",
    )
    add("--out", type=Path, default=Path("plans"), help="output root (default: plans/)")
    add("--onnx-only", action="store_true", help="export the ONNX graphs only (no TensorRT, no GPU needed)")
    add(
        "--builder",
        choices=[*BUILDER_CHOICES, "auto"],
        default="rtx",
        help="rtx: TensorRT-RTX, any machine (default); tensorrt: full TensorRT, on the GPU that runs the plans; "
        "auto: TensorRT-RTX unless this GPU is one it cannot run on and full TensorRT is installed",
    )
    add(
        "--arch",
        nargs="+",
        type=_arch,
        help="TensorRT-RTX: the compute capabilities to build for (default: sm_80 sm_86 sm_89 sm_120 sm_121); "
        "full TensorRT: must be this machine's GPU unless --hardware-compat",
    )
    add("--hardware-compat", choices=["ampere+"], help="full TensorRT: plans that run on any Ampere-or-newer GPU")
    add(
        "--grid-sample",
        choices=sorted(GRID_SAMPLE_OPSETS),
        default="gather",
        help="5-D grid sample as standard gathers (default) or as opset 20's GridSample node",
    )
    add(
        "--random-weights",
        action="store_true",
        help="first write deterministic random checkpoints where files are missing (the pictures are not faces)",
    )
    add("--opt-level", type=int, choices=range(6), help="builder optimisation level (default: the builder's)")
    add(
        "--aot",
        choices=("auto", "only", "no"),
        default="auto",
        help="the torch backend's ahead-of-time compiled packages for this machine's device (docs/startup.md): "
        "auto: after the plans, when torch sees a CUDA GPU (default); only: just the packages (a CPU too); no: none",
    )
    add(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="DDIM steps the LMDM packages are compiled for (default: %(default)s)",
    )
    add(
        "--aot-jobs",
        type=int,
        help="packages compiled at once, each in a process of its own (default: 3 on a GPU, where the build is "
        "bound by compilation, not memory; 1 on the CPU; docs/startup.md)",
    )
    return parser


AOT_NETWORKS = ("lmdm", "warp_network", "decoder")
GPU_AOT_JOBS = 3
"""Packages compiled at once on a GPU by default: each compile is mostly single-threaded, so a few at once shorten the
build (timings by job count: bench/results/2026-12-01_h200_aot_packages_build.json)."""
"""The networks of the packaged calls."""


def _log(message: str) -> None:
    print(message, flush=True)


def _checkpoint_hashes(specs: Sequence[GraphSpec], directory: Path) -> dict[str, str]:
    """sha256 per checkpoint file the graphs need; a missing file is an error that says where it comes from."""
    needed = sorted({OFFICIAL_FILENAMES[c] for spec in specs for c in spec.checkpoints})
    missing = [f for f in needed if not (directory / f).is_file()]
    if missing:
        raise CheckpointError(
            f"missing checkpoint file(s) in {directory}: {', '.join(missing)} (the official files are "
            "ditto_pytorch/models/*.pth on the model hub; --random-weights writes random stand-ins)"
        )
    return {f: file_sha256(directory / f) for f in needed}


def _previous(directory: Path, kind: str) -> dict[str, GraphEntry]:
    """The entries of an existing manifest of ``kind``, or none (with a note) when it is unusable."""
    try:
        manifest = read_manifest(directory)
    except ManifestError as exc:
        if (directory / "manifest.json").exists():
            _log(f"  note: ignoring the old manifest ({exc}); everything is rebuilt")
        return {}
    return manifest.graphs if manifest.kind == kind else {}


def _up_to_date(old: GraphEntry | None, wanted: GraphEntry, directory: Path) -> bool:
    if old is None or not old.same_recipe(wanted):
        return False
    path = directory / old.file
    return path.is_file() and file_sha256(path) == old.sha256


def _profiles_json(spec: GraphSpec, onnx_path: Path) -> dict[str, list[list[int]]]:
    inputs, _ = graph_io(onnx_path)
    shapes = profile_shapes(spec, {name: dims for name, (dims, _) in inputs.items()})
    return {name: [list(s) for s in triple] for name, triple in shapes.items()}


def export_all(
    specs: Sequence[GraphSpec],
    checkpoints: Path,
    hashes: dict[str, str],
    out: Path,
    grid_sample: str,
    hubert: Path | None,
) -> Manifest:
    """Export (or take, for HuBERT) every graph into ``out/onnx``, skipping those whose recipe is unchanged."""
    onnx_dir = out / ONNX_DIR
    onnx_dir.mkdir(parents=True, exist_ok=True)
    previous = _previous(onnx_dir, "onnx")
    manifest = Manifest(
        kind="onnx",
        checkpoints_dir=str(checkpoints),
        build_flags={"grid_sample": grid_sample},
        graphs=dict(previous),
        created=now_iso(),
    )
    for i, spec in enumerate(specs, 1):
        start = time.perf_counter()
        prefix = f"[onnx {i}/{len(specs)}] {spec.name}:"
        if not spec.exported:
            assert hubert is not None
            source = hubert.resolve()
            entry = GraphEntry(str(source), file_sha256(source), {}, "fp32", {}, {"source": "published"})
            entry.profiles = _profiles_json(spec, source)
            manifest.graphs[spec.name] = entry
            _log(f"{prefix} taken as published from {source}")
            continue
        settings = export_settings(spec, grid_sample)
        if spec.name == "warp_decoder":
            settings["composed_from"] = {p: manifest.graphs[p].sha256 for p in spec.checkpoints}
        used = {OFFICIAL_FILENAMES[c]: hashes[OFFICIAL_FILENAMES[c]] for c in spec.checkpoints}
        wanted = GraphEntry(f"{spec.name}.onnx", "", used, "fp32", {}, settings)
        if _up_to_date(previous.get(spec.name), wanted, onnx_dir):
            _log(f"{prefix} unchanged, skipped")
            continue
        if spec.name == "warp_decoder":
            _log(f"{prefix} composing warp_network.onnx and decoder.onnx ...")
            parts = (onnx_dir / "warp_network.onnx", onnx_dir / "decoder.onnx")
            path = merge_warp_decoder(*parts, onnx_dir / wanted.file)
        else:
            _log(
                f"{prefix} exporting (opset {settings['opset']}"
                + (f", grid sample: {grid_sample}" if settings["grid_sample"] else "")
                + ") ..."
            )
            path = export_network(spec.name, checkpoints, onnx_dir / wanted.file, grid_sample)
        wanted.sha256 = file_sha256(path)
        wanted.profiles = _profiles_json(spec, path)
        wanted.built_at, wanted.seconds = now_iso(), round(time.perf_counter() - start, 2)
        manifest.graphs[spec.name] = wanted
        write_manifest(onnx_dir, manifest)
        _log(f"{prefix} wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {wanted.seconds:.1f} s)")
    write_manifest(onnx_dir, manifest)
    return manifest


def converter_sha256() -> str:
    """sha256 of the code that derives FP16 graphs (the converter and the specs' FP32 scopes)."""
    digest = hashlib.sha256()
    for module in (fp16, graphs):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def derive_fp16(specs: Sequence[GraphSpec], onnx: Manifest, out: Path, checkpoints: Path) -> Manifest:
    """Write the FP16 graph of every FP16 spec into ``out/onnx`` and prove it against PyTorch in onnxruntime."""
    onnx_dir = out / ONNX_DIR
    wanted_specs = [s for s in specs if s.precision == "fp16" and s.exported]
    for i, spec in enumerate(wanted_specs, 1):
        start = time.perf_counter()
        prefix = f"[fp16 {i}/{len(wanted_specs)}] {spec.name}:"
        source = onnx.graphs[spec.name]
        settings = {
            "derived_from": source.sha256,
            "converter_sha256": converter_sha256(),
            "fp32_scopes": list(spec.fp32_scopes),
            "fp16_scopes": list(spec.fp16_scopes),
            "half_io": list(spec.half_io),
            "tolerance": FP16_TOLERANCE,
        }
        wanted = GraphEntry(f"{spec.name}{FP16_SUFFIX}.onnx", "", source.checkpoints, "fp16", {}, settings)
        key = spec.name + FP16_SUFFIX
        if _up_to_date(onnx.graphs.get(key), wanted, onnx_dir):
            _log(f"{prefix} unchanged, skipped")
            continue
        islands = ", ".join(spec.fp32_scopes) or "normalizations"
        _log(f"{prefix} deriving from {source.file} (FP32 kept for {islands}) ...")
        path = export_fp16(spec, onnx_dir / source.file, onnx_dir / wanted.file)
        _log(f"{prefix} proving it against PyTorch (float32) in onnxruntime, batch 1 ...")
        errors = onnx_vs_pytorch(spec, path, checkpoints)
        worst = max(errors.values())
        summary = ", ".join(f"{name} {error:.1e}" for name, error in errors.items())
        if worst > FP16_TOLERANCE:
            path.unlink()
            raise ExportError(
                f"{spec.name}: the FP16 graph differs from PyTorch by {summary} (relative), over the tolerance "
                f"{FP16_TOLERANCE:.0e}; no plan is built from it"
            )
        wanted.sha256 = file_sha256(path)
        wanted.profiles = _profiles_json(spec, path)
        wanted.built_at, wanted.seconds = now_iso(), round(time.perf_counter() - start, 2)
        onnx.graphs[key] = wanted
        write_manifest(onnx_dir, onnx)
        _log(
            f"{prefix} wrote {path} ({path.stat().st_size / 1e6:.1f} MB), relative error {summary} "
            f"(tolerance {FP16_TOLERANCE:.0e}), {wanted.seconds:.1f} s"
        )
    return onnx


def plan_source(spec: GraphSpec, onnx: Manifest) -> GraphEntry:
    """The ONNX entry a plan is built from: the FP16 graph for FP16 plans, else the export (or HuBERT as published)."""
    return onnx.graphs[spec.name + FP16_SUFFIX if spec.precision == "fp16" else spec.name]


def build_all(
    specs: Sequence[GraphSpec],
    onnx: Manifest,
    out: Path,
    options: BuildOptions,
    grid_sample: str,
    gpu: GpuInfo | None,
) -> Path:
    """Build a plan per graph into its plan directory under ``out``, skipping those whose recipe is unchanged."""
    trt = import_builder(options.builder)
    version = str(trt.__version__)
    plan_dir = out / plan_dir_name(options.builder, version, options.targets, options.hardware_compat)
    plan_dir.mkdir(parents=True, exist_ok=True)
    previous = _previous(plan_dir, "plans")
    manifest = Manifest(
        kind="plans",
        checkpoints_dir=onnx.checkpoints_dir,
        builder=options.builder,
        builder_version=version,
        compute_capabilities=list(options.targets),
        gpu_name=gpu.name if options.builder == FULL and gpu else None,
        hardware_compat=options.hardware_compat,
        build_flags={**options.flags(), "grid_sample": grid_sample},
        graphs=dict(previous),
        created=now_iso(),
    )
    onnx_dir = out / ONNX_DIR
    timing_cache = plan_dir / TIMING_CACHE if options.builder == FULL else None
    for i, spec in enumerate(specs, 1):
        start = time.perf_counter()
        prefix = f"[plan {i}/{len(specs)}] {spec.name}:"
        source = plan_source(spec, onnx)
        onnx_path = onnx_dir / source.file
        profiles_ = _profiles_json(spec, onnx_path)
        settings = {**options.flags(), "builder_version": version, "profiles": profiles_}
        wanted = GraphEntry(
            f"{spec.name}.plan", "", source.checkpoints, spec.precision, profiles_, settings, source.sha256
        )
        if _up_to_date(previous.get(spec.name), wanted, plan_dir):
            _log(f"{prefix} unchanged, skipped")
            continue
        _log(f"{prefix} building a {spec.precision} plan from {onnx_path.name} for {', '.join(options.targets)} ...")
        shapes = {name: tuple(tuple(s) for s in triple) for name, triple in profiles_.items()}
        wanted.io = build_plan(onnx_path, plan_dir / wanted.file, spec, shapes, options, timing_cache, log=_log)
        wanted.sha256 = file_sha256(plan_dir / wanted.file)
        wanted.built_at, wanted.seconds = now_iso(), round(time.perf_counter() - start, 2)
        manifest.graphs[spec.name] = wanted
        write_manifest(plan_dir, manifest)
        size = (plan_dir / wanted.file).stat().st_size / 1e6
        _log(f"{prefix} wrote {plan_dir / wanted.file} ({size:.1f} MB, {wanted.seconds:.1f} s)")
    write_manifest(plan_dir, manifest)
    return plan_dir


def build_options(args: argparse.Namespace) -> tuple[BuildOptions, GpuInfo | None]:
    """The builder, its targets and settings for this run; refuses what this machine cannot build."""
    gpu = present_gpu()
    builder = choose_builder(args.builder, installed_builders(), gpu)
    try:
        import_builder(builder)
    except TensorRTUnavailable as exc:
        raise TensorRTUnavailable(
            f"{exc}. Without it, --onnx-only still exports every ONNX graph, and the engine runs with --backend torch"
        ) from exc
    hardware_compat = args.hardware_compat or "none"
    if builder == RTX:
        if args.hardware_compat:
            raise BuildTargetError(
                "--hardware-compat is for full TensorRT; TensorRT-RTX plans run on every --arch they are built for"
            )
        targets = rtx_targets(args.arch)
    else:
        if gpu is None:
            raise TensorRTUnavailable(
                "no CUDA GPU here: full TensorRT builds plans on the GPU that runs them. "
                "TensorRT-RTX builds without one: --builder rtx"
            )
        check_target(args.arch, gpu, hardware_compat)
        targets = (gpu.arch,)
    return BuildOptions(builder, targets, args.opt_level, hardware_compat), gpu


def check(plans: Path) -> int:
    """Print whether each plan under ``plans`` can run here; 0 when all can, 1 when not."""
    lines, all_ok = check_report(plans, present_gpu(), installed_builders())
    for line in lines:
        _log(line)
    return 0 if all_ok else 1


def run(args: argparse.Namespace) -> int:
    """The command's work, raising the project's errors; ``main`` turns them into messages."""
    if args.check is not None:
        return check(args.check)
    if args.checkpoints is None:
        raise CheckpointError(
            "--checkpoints DIR is required to build: the official download, or any folder with --random-weights "
            "to write random stand-ins there (or --check PLANS to check built plans)"
        )
    options, gpu = (None, None) if args.onnx_only or args.aot == "only" else build_options(args)
    checkpoints = models_dir(args.checkpoints.resolve())
    if args.random_weights:
        missing = tuple(n for n, f in OFFICIAL_FILENAMES.items() if not (checkpoints / f).is_file())
        if missing:
            _log(f"writing random checkpoints for {', '.join(missing)} into {checkpoints}")
            write_random_checkpoints(checkpoints, seed=0, names=missing)
        _log("note: random weights: every graph and plan is real, but the pictures they make are not faces")
    if not checkpoints.is_dir():
        raise CheckpointError(
            f"--checkpoints {checkpoints} is not a directory: give the official download, "
            "or add --random-weights to write random stand-ins there"
        )
    if args.aot == "only":
        build_aot(checkpoints, args.out, args.steps, args.aot_jobs)
        return 0
    hubert = find_official_hubert(checkpoints)
    names = list(dict.fromkeys(args.networks or DEFAULT_GRAPHS))
    if "warp_decoder" in names:  # composed from these two graphs, which are exported (and built) first
        names = ["warp_network", "decoder"] + [n for n in names if n not in ("warp_network", "decoder")]
    if "hubert" in names and hubert is None:
        raise CheckpointError(
            f"hubert: no {checkpoints.parent}/aux_models/{HUBERT_FILE} (the published streaming HuBERT)"
        )
    specs = [SPECS[n] for n in names]
    hashes = _checkpoint_hashes(specs, checkpoints)
    onnx = export_all(specs, checkpoints, hashes, args.out, args.grid_sample, hubert)
    if options is None:
        _log(f"done: ONNX graphs and manifest in {args.out / ONNX_DIR}")
        return 0
    onnx = derive_fp16(specs, onnx, args.out, checkpoints)
    plan_dir = build_all(specs, onnx, args.out, options, args.grid_sample, gpu)
    _log(f"done: plans and manifest in {plan_dir}; check them with: python -m compile.build_plans --check {plan_dir}")
    if args.aot == "auto" and torch.cuda.is_available():
        build_aot(checkpoints, args.out, args.steps, args.aot_jobs)
    return 0


def build_aot(checkpoints: Path, out: Path, steps: int, jobs: int | None = None) -> None:
    """The torch backend's compiled packages for every runtime bucket, on the GPU when torch sees one, else the CPU;
    ``jobs`` at once (default: 3 on a GPU, 1 on the CPU)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if jobs is None:
        jobs = GPU_AOT_JOBS if device.type == "cuda" else 1
    backend = TorchBackend(checkpoints, device=device, networks=AOT_NETWORKS, compile_networks=False)
    started = time.perf_counter()
    manifest = build_packages(backend, checkpoints, out, steps, WINDOW_BUCKETS, RENDER_BUCKETS, jobs=jobs)
    built = sum(p.seconds for p in manifest.packages)
    _log(
        f"done: {len(manifest.packages)} compiled packages for {manifest.target.device} in "
        f"{out / manifest.target.folder()} "
        f"({time.perf_counter() - started:.0f} s; {built:.0f} s of it compiling); the torch backend uses them with "
        f"plans={out}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run; a known failure prints one clear message and returns 2."""
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except (BackendError, BuildTargetError, PlanBuildError, CheckpointError, ExportError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

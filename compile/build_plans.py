"""``python -m compile.build_plans``: turn Ditto checkpoints into ONNX graphs and TensorRT plans for this GPU.

ONNX graphs go to ``<out>/onnx/`` and plans to ``<out>/<sm_XY>-trt<version>/``, each directory
with a JSON manifest; a second run redoes only what changed (checkpoint, ONNX or setting
hashes). ``--onnx-only`` needs neither TensorRT nor a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from compile.export import (
    GRID_SAMPLE_OPSETS,
    ExportError,
    export_network,
    export_settings,
    graph_io,
    merge_warp_decoder,
)
from compile.manifest import (
    ONNX_DIR,
    GraphEntry,
    Manifest,
    ManifestError,
    file_sha256,
    now_iso,
    parse_compute_capability,
    plan_dir_name,
    read_manifest,
    write_manifest,
)
from compile.profiles import DEFAULT_GRAPHS, SPECS, GraphSpec, ProfileError, profile_shapes
from compile.trt_build import (
    BuildOptions,
    BuildTargetError,
    PlanBuildError,
    TensorRTUnavailable,
    build_plan,
    check_target,
    import_tensorrt,
    present_gpu,
)
from engine.backends.base import BackendError
from engine.audio.hubert import OFFICIAL_FILE as HUBERT_FILE
from engine.audio.hubert import find_official_hubert
from engine.engine import models_dir
from engine.networks import OFFICIAL_FILENAMES, CheckpointError, write_random_checkpoints

TIMING_CACHE = "timing.cache"


def _arch(value: str) -> str:
    try:
        parse_compute_capability(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m compile.build_plans",
        description="Export Ditto's networks to ONNX and build TensorRT plans for the GPU of this machine.",
    )
    add = parser.add_argument
    add("--checkpoints", required=True, type=Path,
        help="the official download (its ditto_pytorch/models) or a folder of the six .pth files")
    add("--networks", nargs="+", choices=sorted(SPECS),
        help="graphs to build (default: all but warp_decoder, the merged warp+decode graph)")
    add("--out", type=Path, default=Path("plans"), help="output root (default: plans/)")
    add("--onnx-only", action="store_true", help="export the ONNX graphs only (no TensorRT, no GPU needed)")
    add("--hardware-compat", choices=["ampere+"], help="plans that run on any Ampere-or-newer GPU")
    add("--arch", type=_arch, help="target GPU, e.g. sm_89; must be this machine's GPU unless --hardware-compat")
    add("--grid-sample", choices=sorted(GRID_SAMPLE_OPSETS), default="gather",
        help="5-D grid sample as standard gathers (default) or as opset 20's GridSample node")
    add("--random-weights", action="store_true",
        help="first write deterministic random checkpoints where files are missing (the pictures are not faces)")
    add("--opt-level", type=int, choices=range(6), default=5, help="TensorRT builder optimisation level")
    return parser


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
    specs: Sequence[GraphSpec], checkpoints: Path, hashes: dict[str, str], out: Path, grid_sample: str,
    hubert: Path | None,
) -> Manifest:
    """Export (or take, for HuBERT) every graph into ``out/onnx``, skipping those whose recipe is unchanged."""
    onnx_dir = out / ONNX_DIR
    onnx_dir.mkdir(parents=True, exist_ok=True)
    previous = _previous(onnx_dir, "onnx")
    manifest = Manifest(
        kind="onnx", checkpoints_dir=str(checkpoints), build_flags={"grid_sample": grid_sample},
        graphs=dict(previous), created=now_iso(),
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
            _log(f"{prefix} exporting (opset {settings['opset']}"
                 + (f", grid sample: {grid_sample}" if settings["grid_sample"] else "") + ") ...")
            path = export_network(spec.name, checkpoints, onnx_dir / wanted.file, grid_sample)
        wanted.sha256 = file_sha256(path)
        wanted.profiles = _profiles_json(spec, path)
        wanted.built_at, wanted.seconds = now_iso(), round(time.perf_counter() - start, 2)
        manifest.graphs[spec.name] = wanted
        write_manifest(onnx_dir, manifest)
        _log(f"{prefix} wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {wanted.seconds:.1f} s)")
    write_manifest(onnx_dir, manifest)
    return manifest


def build_all(specs: Sequence[GraphSpec], onnx: Manifest, out: Path, options: BuildOptions, grid_sample: str) -> Path:
    """Build a plan per graph into ``out/<sm_XY>-trt<version>``, skipping those whose recipe is unchanged."""
    trt = import_tensorrt()
    gpu = present_gpu()
    plan_dir = out / plan_dir_name(gpu.arch, trt.__version__, options.hardware_compat)
    plan_dir.mkdir(parents=True, exist_ok=True)
    previous = _previous(plan_dir, "plans")
    manifest = Manifest(
        kind="plans", checkpoints_dir=onnx.checkpoints_dir, tensorrt_version=trt.__version__,
        compute_capability=gpu.arch, gpu_name=gpu.name, hardware_compat=options.hardware_compat,
        build_flags={**options.flags(), "grid_sample": grid_sample}, graphs=dict(previous), created=now_iso(),
    )
    onnx_dir = out / ONNX_DIR
    for i, spec in enumerate(specs, 1):
        start = time.perf_counter()
        prefix = f"[plan {i}/{len(specs)}] {spec.name}:"
        source = onnx.graphs[spec.name]
        onnx_path = onnx_dir / source.file
        profiles = _profiles_json(spec, onnx_path)
        settings = {
            **options.flags(), "tensorrt": trt.__version__, "gpu": gpu.arch, "profiles": profiles,
            "fp32_scopes": list(spec.fp32_scopes), "fp16_scopes": list(spec.fp16_scopes),
            "half_io": list(spec.half_io),
        }
        wanted = GraphEntry(
            f"{spec.name}.plan", "", source.checkpoints, spec.precision, profiles, settings, source.sha256
        )
        if _up_to_date(previous.get(spec.name), wanted, plan_dir):
            _log(f"{prefix} unchanged, skipped")
            continue
        _log(f"{prefix} building from {onnx_path} ...")
        shapes = {name: tuple(tuple(s) for s in triple) for name, triple in profiles.items()}
        build_plan(onnx_path, plan_dir / wanted.file, spec, shapes, options, plan_dir / TIMING_CACHE, log=_log)
        wanted.sha256 = file_sha256(plan_dir / wanted.file)
        wanted.built_at, wanted.seconds = now_iso(), round(time.perf_counter() - start, 2)
        manifest.graphs[spec.name] = wanted
        write_manifest(plan_dir, manifest)
        _log(f"{prefix} wrote {plan_dir / wanted.file} ({wanted.seconds:.0f} s)")
    write_manifest(plan_dir, manifest)
    return plan_dir


def run(args: argparse.Namespace) -> int:
    """The command's work, raising the project's errors; ``main`` turns them into messages."""
    hardware_compat = args.hardware_compat or "none"
    if not args.onnx_only:
        try:
            import_tensorrt()
            gpu = present_gpu()
        except TensorRTUnavailable as exc:
            raise TensorRTUnavailable(
                f"{exc}. Without it, --onnx-only still exports every ONNX graph, "
                "and the engine runs with --backend torch"
            ) from exc
        check_target(args.arch, gpu, hardware_compat)
    checkpoints = models_dir(args.checkpoints.resolve())
    if args.random_weights:
        missing = tuple(n for n, f in OFFICIAL_FILENAMES.items() if not (checkpoints / f).is_file())
        if missing:
            _log(f"writing random checkpoints for {', '.join(missing)} into {checkpoints}")
            write_random_checkpoints(checkpoints, seed=0, names=missing)
        _log("note: random weights: every graph and plan is real, but the pictures they make are not faces")
    if not checkpoints.is_dir():
        raise CheckpointError(f"--checkpoints {checkpoints} is not a directory")
    hubert = find_official_hubert(checkpoints)
    names = list(dict.fromkeys(args.networks or DEFAULT_GRAPHS))
    if "warp_decoder" in names:  # composed from these two graphs, which are exported (and built) first
        names = ["warp_network", "decoder"] + [n for n in names if n not in ("warp_network", "decoder")]
    if "hubert" in names and hubert is None:
        message = f"hubert: no {checkpoints.parent}/aux_models/{HUBERT_FILE} (the published streaming HuBERT)"
        if args.networks:
            raise CheckpointError(message)
        _log(f"skipping {message}")
        names.remove("hubert")
    specs = [SPECS[n] for n in names]
    hashes = _checkpoint_hashes(specs, checkpoints)
    onnx = export_all(specs, checkpoints, hashes, args.out, args.grid_sample, hubert)
    if args.onnx_only:
        _log(f"done: ONNX graphs and manifest in {args.out / ONNX_DIR}")
        return 0
    options = BuildOptions(optimization_level=args.opt_level, hardware_compat=hardware_compat)
    plan_dir = build_all(specs, onnx, args.out, options, args.grid_sample)
    _log(f"done: plans and manifest in {plan_dir}; check them with: python -m compile.parity --plans {plan_dir} "
         f"--checkpoints {checkpoints}")
    return 0


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

"""Build one plan from one ONNX graph, with TensorRT-RTX (on any machine) or full TensorRT (on the GPU).

Both builders get strongly typed networks: each layer runs in the type its tensors have in the
graph, so an FP16 plan is built from the FP16 graph of ``compile.fp16`` and no precision flag is
set; TF32 is off, so FP32 layers (the LMDM, the warp's geometry) stay true FP32. TensorRT-RTX
compiles ahead of time for the given compute capabilities without a GPU; full TensorRT builds
for the GPU it runs on (or any Ampere-or-newer GPU with hardware compatibility). Each plan gets
the one optimization profile of ``compile.profiles``. The weights are inside the plan (see
docs/tensorrt.md for why not refitted at load). The libraries are imported only to build or load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from tqdm import tqdm

from engine.plans.graphs import GraphSpec
from engine.plans.libraries import FULL, INSTALL, RTX, RTX_TARGETS, TensorRTUnavailable, import_builder
from engine.plans.targets import GpuInfo, parse_compute_capability

BUILDER_CHOICES = {"rtx": RTX, "tensorrt": FULL}
RTX_DEFAULT_TARGETS: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
"""The compute capabilities TensorRT-RTX plans are built for by default: every one from Ampere on."""

Shapes = Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
TensorIO = dict[str, list[dict[str, Any]]]


class PlanBuildError(RuntimeError):
    """TensorRT could not parse a graph or build its plan."""


class BuildTargetError(ValueError):
    """The requested plan target cannot be built on this machine."""


@dataclass(frozen=True)
class BuildOptions:
    """Builder settings shared by every plan of one build; they go into the manifest's build flags.

    ``targets``: the compute capabilities TensorRT-RTX compiles for, or the one GPU full TensorRT
    builds on. ``optimization_level`` None keeps the builder's default.
    """

    builder: str = RTX
    targets: tuple[str, ...] = RTX_DEFAULT_TARGETS
    optimization_level: int | None = None
    hardware_compat: str = "none"

    def flags(self) -> dict[str, Any]:
        return {
            "builder": self.builder,
            "targets": list(self.targets),
            "builder_optimization_level": self.optimization_level,
            "hardware_compat": self.hardware_compat,
            "tf32": False,
            "strongly_typed": True,
        }


def choose_builder(requested: str, installed: Mapping[str, str], gpu: GpuInfo | None) -> str:
    """The builder for ``--builder``: ``rtx`` and ``tensorrt`` as asked; ``auto`` takes TensorRT-RTX unless
    this machine's GPU is one it cannot run on and full TensorRT is installed."""
    if requested != "auto":
        return BUILDER_CHOICES[requested]
    rtx_runs_here = gpu is None or gpu.arch in RTX_TARGETS
    if FULL in installed and gpu is not None and (RTX not in installed or not rtx_runs_here):
        return FULL
    if RTX in installed:
        return RTX
    raise TensorRTUnavailable(
        "neither TensorRT-RTX nor TensorRT is installed here: "
        f"{INSTALL[RTX]} (builds on any machine) or {INSTALL[FULL]} (builds on the GPU that runs the plans)"
    )


def rtx_targets(requested: Iterable[str] | None) -> tuple[str, ...]:
    """The compute capabilities to compile TensorRT-RTX plans for (default: Ampere and newer)."""
    targets = tuple(dict.fromkeys(requested or RTX_DEFAULT_TARGETS))
    unknown = [t for t in targets if t not in RTX_TARGETS]
    if unknown:
        raise BuildTargetError(
            f"TensorRT-RTX cannot build for {', '.join(unknown)}: its targets are {', '.join(RTX_TARGETS)} "
            "(Hopper sm_90 and datacenter Blackwell sm_100 need full TensorRT: --builder tensorrt)"
        )
    return targets


def check_target(targets: Iterable[str] | None, gpu: GpuInfo, hardware_compat: str) -> None:
    """Refuse a full-TensorRT target this machine cannot build: another architecture without hardware
    compatibility, or hardware compatibility on a GPU older than Ampere."""
    if hardware_compat == "ampere+" and gpu.major < 8:
        raise BuildTargetError(
            f"--hardware-compat ampere+ builds on Ampere or newer GPUs (sm_80+); this GPU ({gpu.name}) is {gpu.arch}"
        )
    for target in targets or ():
        if target == gpu.arch:
            continue
        if hardware_compat == "ampere+":
            if parse_compute_capability(target)[0] < 8:
                raise BuildTargetError(f"hardware-compatible (ampere+) plans run on sm_80 and newer, not on {target}")
            continue
        raise BuildTargetError(
            f"--arch {target} asks for plans for {target}, but this machine's GPU is {gpu.name} ({gpu.arch}). "
            f"Full TensorRT builds plans for the GPU it runs on: build on a {target} machine, add "
            "--hardware-compat ampere+ for plans that run on any Ampere-or-newer GPU (often somewhat slower), "
            "or build TensorRT-RTX plans for it on any machine (--builder rtx)"
        )


def _numpy_dtype(trt: ModuleType, dtype: Any) -> str:
    return np.dtype(trt.nptype(dtype)).name


def network_io(trt: ModuleType, network: Any) -> TensorIO:
    """Inputs and outputs of a parsed network: name, shape (-1 where dynamic) and numpy dtype name."""

    def describe(tensor: Any) -> dict[str, Any]:
        return {"name": tensor.name, "shape": list(tensor.shape), "dtype": _numpy_dtype(trt, tensor.dtype)}

    return {
        "inputs": [describe(network.get_input(i)) for i in range(network.num_inputs)],
        "outputs": [describe(network.get_output(i)) for i in range(network.num_outputs)],
    }


def _progress_monitor(trt: ModuleType, label: str) -> Any:
    """A TensorRT progress monitor that shows the build's top phase as a bar and its current sub-phase."""

    class Progress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.bar: tqdm | None = None
            self.top: str | None = None

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            if parent_phase is None and self.bar is None:
                self.top = phase_name
                # On a terminal only: in a log the "[plan i/n]" lines before and after say it all.
                self.bar = tqdm(total=num_steps, desc=f"  {label}", unit="step", disable=None)
            elif self.bar is not None:
                self.bar.set_postfix_str(phase_name.lower(), refresh=False)

        def step_complete(self, phase_name: str, step: int) -> bool:
            if phase_name == self.top and self.bar is not None:
                self.bar.update(1)
            return True

        def phase_finish(self, phase_name: str) -> None:
            if phase_name == self.top and self.bar is not None:
                self.bar.update(self.bar.total - self.bar.n)
                self.bar.set_postfix_str("done")
                self.bar.close()
                self.bar = None

    return Progress()


def build_plan(
    onnx_path: Path,
    plan_path: Path,
    spec: GraphSpec,
    profiles: Shapes,
    options: BuildOptions,
    timing_cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> TensorIO:
    """Parse ``onnx_path`` and build its plan to ``plan_path`` (atomically); returns the network's I/O.

    ``timing_cache`` is full TensorRT's (TensorRT-RTX would need a GPU to use one).
    """
    trt = import_builder(options.builder)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n  ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise PlanBuildError(
            f"{spec.name}: {trt.__name__} {trt.__version__} cannot parse {onnx_path}:\n  {errors}\n"
            "(a graph exported with --grid-sample opset20 needs 5-D GridSample support; "
            "the default --grid-sample gather needs none)"
        )
    io = network_io(trt, network)
    config = builder.create_builder_config()
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    config.clear_flag(trt.BuilderFlag.TF32)
    if options.builder == RTX:
        config.num_compute_capabilities = len(options.targets)
        for index, target in enumerate(options.targets):
            config.set_compute_capability(getattr(trt.ComputeCapability, target.replace("sm_", "SM")), index)
    elif options.hardware_compat == "ampere+":
        config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profiles.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    if timing_cache is not None and options.builder == FULL:
        cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
        if not config.set_timing_cache(cache, False):
            config.set_timing_cache(config.create_timing_cache(b""), False)
            log(f"  {timing_cache} was written by another TensorRT or GPU; starting a new timing cache")
    monitor = _progress_monitor(trt, spec.name)
    config.progress_monitor = monitor
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise PlanBuildError(
            f"{spec.name}: {trt.__name__} could not build a plan from {onnx_path}; its log above says why"
        )
    tmp = plan_path.with_suffix(".plan.tmp")
    with open(tmp, "wb") as f:
        f.write(memoryview(serialized))
    os.replace(tmp, plan_path)
    if timing_cache is not None and options.builder == FULL:
        timing_cache.write_bytes(memoryview(config.get_timing_cache().serialize()))
    return io

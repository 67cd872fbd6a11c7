"""Build one TensorRT plan from one ONNX graph with TensorRT's Python API.

FP16 plans keep chosen layers (the warp's geometry: grid samples, dense-motion arithmetic) in
FP32 through precision constraints; FP32 plans (motion extractor, stitching, LMDM, HuBERT) get
no FP16 flag at all, and no TF32. Each plan gets one optimization profile from ``compile.profiles``, a shared timing cache, a
builder optimisation level and, on request, Ampere+ hardware compatibility. TensorRT is
imported only when a plan is built or loaded, so everything else runs without it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from compile.manifest import compute_capability_name, parse_compute_capability
from compile.profiles import GraphSpec
from engine.backends.base import BackendError

INSTALL_HINT = (
    "install it on a machine with an NVIDIA GPU and driver: pip install 'tensorrt>=10.8,<11' "
    "(10.8 is the first with RTX 50-series, sm_120, kernels)"
)
# Never pinned to FP32: data movement (its precision is whatever flows through it) and the heavy
# compute an FP16 plan is built for.
_NEVER_PINNED = frozenset(
    {"CONSTANT", "SHAPE", "SHUFFLE", "CONCATENATION", "GATHER", "SLICE", "IDENTITY", "ASSERTION", "FILL", "CONDITION"}
    | {"CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "POOLING", "RESIZE"}
)

Shapes = Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


class TensorRTUnavailable(BackendError):
    """TensorRT (or the GPU it needs) is not available on this machine."""


class PlanBuildError(RuntimeError):
    """TensorRT could not parse a graph or build its plan."""


class BuildTargetError(ValueError):
    """The requested plan target cannot be built on this machine."""


@dataclass(frozen=True)
class GpuInfo:
    """The GPU plans are built for or loaded on."""

    index: int
    name: str
    major: int
    minor: int

    @property
    def arch(self) -> str:
        return compute_capability_name(self.major, self.minor)


@dataclass(frozen=True)
class BuildOptions:
    """Builder settings shared by every plan of one build; they go into the manifest's build flags."""

    optimization_level: int = 5
    hardware_compat: str = "none"

    def flags(self) -> dict[str, Any]:
        return {"builder_optimization_level": self.optimization_level, "hardware_compat": self.hardware_compat}


def import_tensorrt() -> ModuleType:
    """``import tensorrt``, or a TensorRTUnavailable that says how to get it."""
    try:
        trt = importlib.import_module("tensorrt")
    except Exception as exc:  # a broken install raises OSError or RuntimeError from its loader, not only ImportError
        raise TensorRTUnavailable(
            f"TensorRT is not installed here ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        ) from exc
    major = int(str(trt.__version__).split(".")[0])
    if major < 10:
        raise TensorRTUnavailable(f"TensorRT {trt.__version__} is too old: the plans need TensorRT 10; {INSTALL_HINT}")
    return trt


def present_gpu(index: int = 0) -> GpuInfo:
    """The CUDA GPU at ``index``, or TensorRTUnavailable when this machine has none."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() <= index:
        raise TensorRTUnavailable(
            f"no CUDA GPU {index} here (torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}): "
            "TensorRT plans are built and run on the GPU that uses them"
        )
    major, minor = torch.cuda.get_device_capability(index)
    return GpuInfo(index, torch.cuda.get_device_name(index), major, minor)


def check_target(target: str | None, gpu: GpuInfo, hardware_compat: str) -> None:
    """Refuse a target this machine cannot build: another architecture without hardware compatibility,
    or hardware compatibility on a GPU older than Ampere."""
    if hardware_compat == "ampere+" and gpu.major < 8:
        raise BuildTargetError(
            f"--hardware-compat ampere+ builds on Ampere or newer GPUs (sm_80+); this GPU ({gpu.name}) is {gpu.arch}"
        )
    if target is None or target == gpu.arch:
        return
    wanted = parse_compute_capability(target)
    if hardware_compat == "ampere+":
        if wanted[0] < 8:
            raise BuildTargetError(f"hardware-compatible (ampere+) plans run on sm_80 and newer, not on {target}")
        return
    raise BuildTargetError(
        f"--arch {target} asks for plans for {target}, but this machine's GPU is {gpu.name} ({gpu.arch}). "
        f"TensorRT builds plans for the GPU it runs on: build on a {target} machine, or add "
        "--hardware-compat ampere+ for plans that run on any Ampere-or-newer GPU (often somewhat slower)"
    )


def keeps_fp32(layer_name: str, layer_type: str, spec: GraphSpec) -> bool:
    """Whether an FP16 plan pins this layer to FP32: light arithmetic inside one of the spec's FP32
    scopes and outside its FP16 scopes (TensorRT names layers after their ONNX nodes)."""
    lowered = layer_name.lower()
    return (
        layer_type not in _NEVER_PINNED
        and any(scope in lowered for scope in spec.fp32_scopes)
        and not any(scope in lowered for scope in spec.fp16_scopes)
    )


def pin_fp32_layers(trt: ModuleType, network: Any, spec: GraphSpec) -> list[str]:
    """Set FP32 precision and output types on the network's float layers that ``keeps_fp32`` selects."""
    float_types = {trt.float32, trt.float16}
    pinned = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        layer_type = str(layer.type).rsplit(".", 1)[-1]
        outputs = [layer.get_output(j) for j in range(layer.num_outputs)]
        if not keeps_fp32(layer.name, layer_type, spec) or not outputs:
            continue
        if any(t.dtype not in float_types for t in outputs):
            continue
        layer.precision = trt.float32
        for j in range(layer.num_outputs):
            layer.set_output_type(j, trt.float32)
        pinned.append(layer.name)
    return pinned


def _set_half_io(trt: ModuleType, network: Any, names: tuple[str, ...]) -> None:
    tensors = [network.get_input(i) for i in range(network.num_inputs)]
    tensors += [network.get_output(i) for i in range(network.num_outputs)]
    by_name = {t.name: t for t in tensors}
    for name in names:
        if name not in by_name:
            raise PlanBuildError(
                f"the graph has no input or output {name!r} to bind as float16 (has {sorted(by_name)})"
            )
        by_name[name].dtype = trt.float16


def build_plan(
    onnx_path: Path,
    plan_path: Path,
    spec: GraphSpec,
    profiles: Shapes,
    options: BuildOptions,
    timing_cache: Path,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Parse ``onnx_path``, build the plan to ``plan_path`` (atomically); returns the layers pinned to FP32."""
    trt = import_tensorrt()
    if int(trt.__version__.split(".")[0]) >= 11:
        raise PlanBuildError(
            f"TensorRT {trt.__version__} builds only strongly typed networks; this builder sets FP16 with "
            f"TensorRT 10's builder flag and per-layer FP32 constraints: {INSTALL_HINT}"
        )
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n  ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise PlanBuildError(
            f"{spec.name}: TensorRT {trt.__version__} cannot parse {onnx_path}:\n  {errors}\n"
            "(a graph exported with --grid-sample opset20 needs 5-D GridSample support in TensorRT; "
            "the default --grid-sample gather needs none)"
        )
    config = builder.create_builder_config()
    config.builder_optimization_level = options.optimization_level
    config.clear_flag(trt.BuilderFlag.TF32)  # FP32 layers stay true FP32 (TensorRT enables TF32 by default)
    if options.hardware_compat == "ampere+":
        config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
    pinned: list[str] = []
    if spec.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
        pinned = pin_fp32_layers(trt, network, spec)
        if pinned:
            config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
        _set_half_io(trt, network, spec.half_io)
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profiles.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
    if not config.set_timing_cache(cache, False):
        config.set_timing_cache(config.create_timing_cache(b""), False)
        log(f"  {timing_cache} was written by another TensorRT or GPU; starting a new timing cache")
    log(
        f"  building {spec.precision} plan (optimisation level {options.optimization_level}, "
        f"{len(pinned)} layers pinned to fp32)"
    )
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise PlanBuildError(f"{spec.name}: TensorRT could not build a plan from {onnx_path}; its log above says why")
    tmp = plan_path.with_suffix(".plan.tmp")
    with open(tmp, "wb") as f:
        f.write(memoryview(serialized))
    os.replace(tmp, plan_path)
    timing_cache.write_bytes(memoryview(config.get_timing_cache().serialize()))
    return pinned

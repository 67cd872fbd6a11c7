"""What each compiled graph looks like, in one place: I/O names, shapes, batch ranges, precision.

The exporter names its inputs and outputs from these specs, the plan builder makes its
optimization profiles from them, and the TensorRT backend checks its bindings against them.
A shape entry is an int (fixed), ``BATCH`` (the runtime's batch axis, its range in the spec's
``ranges``), or another name: a size the checkpoint fixes (the LMDM condition width) or another
dynamic axis with its own range (HuBERT's ``samples``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compile.trilinear import GRID_SAMPLE_SCOPE
from engine.networks.checkpoints import NETWORK_NAMES

BATCH = "batch"

# Batch sizes the serving runtime pads each stage to. Render: frames per warp+decode call (a
# 200 ms audio hop is 5 frames at 25 fps, so one session fills the smallest bucket). LMDM:
# windows per denoiser call, one per session; the guided call runs 2B rows inside the graph.
RENDER_BUCKETS: tuple[int, ...] = (5, 10, 20, 40)
LMDM_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16)
# One dynamic profile per graph covers every bucket: (min, opt, max). The minimum is 1 so a
# partial batch needs no padding; opt is the middle bucket, where full TensorRT tunes its
# tactics (TensorRT-RTX specializes kernels per shape at run time). A profile per bucket
# measured +9.8 MB (decoder) and +10.9 MB (warp) per plan and 2.5-3x the build time, for nothing
# TensorRT-RTX needs (docs/tensorrt.md).
RENDER_BATCH: tuple[int, int, int] = (1, RENDER_BUCKETS[1], RENDER_BUCKETS[-1])
LMDM_BATCH: tuple[int, int, int] = (1, LMDM_BUCKETS[2], LMDM_BUCKETS[-1])
SINGLE: tuple[int, int, int] = (1, 1, 1)
# HuBERT streaming chunk: 6480 samples (ten 40 ms frames + 80 samples), half and double allowed.
HUBERT_SAMPLES: tuple[int, int, int] = (3240, 6480, 12960)


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: its name, shape entries and ONNX element type."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class GraphSpec:
    """A compiled graph: the checkpoints it is made from, its I/O, its dynamic ranges and precision policy.

    ``precision`` is the plan's precision; ``fp32_scopes`` name ONNX node scopes whose
    arithmetic stays float32 inside an fp16 graph, except inside ``fp16_scopes``; ``half_io`` are
    the tensors an fp16 graph (and its plan) binds as float16.
    """

    name: str
    checkpoints: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ranges: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    precision: str = "fp16"
    fp32_scopes: tuple[str, ...] = ()
    fp16_scopes: tuple[str, ...] = ()
    half_io: tuple[str, ...] = ()
    exported: bool = True

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @property
    def dynamic_batch(self) -> bool:
        return self.ranges.get(BATCH, SINGLE) != SINGLE

    def plan_dtype(self, tensor: TensorSpec) -> str:
        """The numpy dtype name a plan binds ``tensor`` as: float16 for the fp16 graph's half I/O."""
        return "float16" if self.precision == "fp16" and tensor.name in self.half_io else tensor.dtype


# The warp's geometry stays float32 in fp16 plans, as in the PyTorch path: both 5-D grid samples
# (ours or opset 20's node) and the dense-motion arithmetic (grid, heatmaps, softmax blend), but
# not the hourglass; convolutions always run in fp16 (see compile.fp16.keeps_fp32).
WARP_FP32_SCOPES: tuple[str, ...] = (GRID_SAMPLE_SCOPE, "gridsample", "dense_motion_network/")
WARP_FP16_SCOPES: tuple[str, ...] = ("hourglass/",)

_KP = (BATCH, 21, 3)
_FEATURE_3D = TensorSpec("feature_3d", (BATCH, 32, 16, 64, 64))
_RENDER_INPUTS = (_FEATURE_3D, TensorSpec("kp_source", _KP), TensorSpec("kp_driving", _KP))

SPECS: dict[str, GraphSpec] = {
    spec.name: spec
    for spec in (
        GraphSpec(
            "appearance_extractor",
            ("appearance_extractor",),
            (TensorSpec("image", (BATCH, 3, 256, 256)),),
            (TensorSpec("pred", (BATCH, 32, 16, 64, 64)),),
            {BATCH: SINGLE},
            half_io=("pred",),
        ),
        GraphSpec(
            "motion_extractor",
            ("motion_extractor",),
            (TensorSpec("image", (BATCH, 3, 256, 256)),),
            tuple(
                TensorSpec(n, (BATCH, k))
                for n, k in (("pitch", 66), ("yaw", 66), ("roll", 66), ("t", 3), ("exp", 63), ("scale", 1), ("kp", 63))
            ),
            {BATCH: SINGLE},
            precision="fp32",
        ),
        GraphSpec(
            "warp_network",
            ("warp_network",),
            _RENDER_INPUTS,
            (TensorSpec("out", (BATCH, 256, 64, 64)),),
            {BATCH: RENDER_BATCH},
            fp32_scopes=WARP_FP32_SCOPES,
            fp16_scopes=WARP_FP16_SCOPES,
            half_io=("feature_3d", "out"),
        ),
        GraphSpec(
            "decoder",
            ("decoder",),
            (TensorSpec("feature", (BATCH, 256, 64, 64)),),
            (TensorSpec("output", (BATCH, 3, 512, 512)),),
            {BATCH: RENDER_BATCH},
            half_io=("feature", "output"),
        ),
        GraphSpec(
            "stitch_network",
            ("stitch_network",),
            (TensorSpec("kp_source", _KP), TensorSpec("kp_driving", _KP)),
            (TensorSpec("out", _KP),),
            {BATCH: RENDER_BATCH},
            precision="fp32",
        ),
        GraphSpec(
            "lmdm",
            ("lmdm",),
            (
                TensorSpec("x", (BATCH, 80, 265)),
                TensorSpec("cond_frame", (BATCH, 265)),
                TensorSpec("cond", (BATCH, 80, "cond_width")),
                TensorSpec("time_cond", (BATCH,), "int64"),
            ),
            (TensorSpec("pred_noise", (BATCH, 80, 265)), TensorSpec("x_start", (BATCH, 80, 265))),
            {BATCH: LMDM_BATCH},
            precision="fp32",
        ),
        GraphSpec(
            "warp_decoder",
            ("warp_network", "decoder"),
            _RENDER_INPUTS,
            (TensorSpec("output", (BATCH, 3, 512, 512)),),
            {BATCH: RENDER_BATCH},
            fp32_scopes=WARP_FP32_SCOPES,
            fp16_scopes=WARP_FP16_SCOPES,
            half_io=("feature_3d", "output"),
        ),
        GraphSpec(
            "hubert",
            (),
            (TensorSpec("input_values", (1, "samples")),),
            (TensorSpec("encoding_out", ("frames", 1024)),),
            {"samples": HUBERT_SAMPLES},
            precision="fp32",
            exported=False,
        ),
    )
}

# Built by default; ``warp_decoder`` (warp and decode merged into one graph) only on request.
DEFAULT_GRAPHS: tuple[str, ...] = (*NETWORK_NAMES, "hubert")


class ProfileError(ValueError):
    """A graph's inputs do not fit its spec, so no optimization profile can be made."""


def profile_shapes(
    spec: GraphSpec, graph_inputs: dict[str, tuple[int | str, ...]]
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) shape per input, from the graph's own input shapes and the spec's ranges."""
    if tuple(graph_inputs) != spec.input_names:
        raise ProfileError(
            f"{spec.name}: the graph's inputs are {list(graph_inputs)}, expected {list(spec.input_names)}"
        )
    shapes = {}
    for tensor in spec.inputs:
        dims = graph_inputs[tensor.name]
        if len(dims) != len(tensor.shape):
            raise ProfileError(f"{spec.name}: input {tensor.name} has rank {len(dims)}, expected {len(tensor.shape)}")
        ranges = [_axis_range(spec, tensor, dim, expected) for dim, expected in zip(dims, tensor.shape)]
        shapes[tensor.name] = tuple(tuple(r[i] for r in ranges) for i in range(3))
    return shapes


def _axis_range(spec: GraphSpec, tensor: TensorSpec, dim: int | str, expected: int | str) -> tuple[int, int, int]:
    """(min, opt, max) of one axis: the graph's fixed size, or the spec's range for a dynamic axis."""
    where = f"{spec.name}: input {tensor.name} axis {expected!r}"
    if isinstance(dim, str):
        if isinstance(expected, int):
            return (expected, expected, expected)
        if expected in spec.ranges:
            return spec.ranges[expected]
        raise ProfileError(f"{where} is dynamic ({dim!r}) in the graph, but the checkpoint fixes its size")
    if isinstance(expected, int) and dim != expected:
        raise ProfileError(f"{where} has size {dim} in the graph, expected {expected}")
    if isinstance(expected, str) and spec.ranges.get(expected, (dim,) * 3) != (dim,) * 3:
        raise ProfileError(f"{where} is fixed ({dim}) in the graph but dynamic {spec.ranges[expected]} in the spec")
    return (dim, dim, dim)

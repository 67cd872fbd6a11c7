"""What each compiled graph looks like, in one place: I/O names, shapes, batch ranges, precision.

The exporter (``compile``) names its inputs and outputs from these specs and makes its
optimization profiles from them; the TensorRT backend checks a plan's bindings against them.
A shape entry is an int (fixed), ``BATCH`` (the runtime's batch axis, its range in the spec's
``ranges``), or another name: a size the checkpoint fixes (the LMDM condition width) or another
dynamic axis with its own range (HuBERT's ``samples``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.buckets import RENDER_BUCKETS, WINDOW_BUCKETS

BATCH = "batch"
GRID_SAMPLE_SCOPE = "grid_sample"
"""The ONNX scope of every node the exporter's 5-D trilinear grid sample emits (``compile.trilinear``)."""

# The serving runtime pads each stage to its batch buckets (engine.buckets); the guided LMDM call
# runs 2B rows inside the graph.
# One dynamic profile per graph covers every bucket: (min, opt, max). The minimum is 1 so a
# partial batch needs no padding; opt is the middle bucket, where full TensorRT tunes its
# tactics (TensorRT-RTX specializes kernels per shape at run time). A profile per bucket would
# cost plan size and build time for nothing TensorRT-RTX needs (docs/tensorrt.md).
RENDER_BATCH: tuple[int, int, int] = (1, RENDER_BUCKETS[1], RENDER_BUCKETS[-1])
LMDM_BATCH: tuple[int, int, int] = (1, WINDOW_BUCKETS[2], WINDOW_BUCKETS[-1])
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

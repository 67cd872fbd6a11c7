"""Every exported graph computes its PyTorch module under onnxruntime as closely as float32 PyTorch
does (both judged against a float64 evaluation), has the spec's I/O names, dtypes and batch axis,
and is free of what TensorRT should not see."""

from __future__ import annotations

import collections
import functools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from compile.export import (
    GraphModule,
    check_graph_io,
    example_inputs,
    export_graph,
    graph_io,
    load_graph_networks,
    merge_warp_decoder,
    symbol_sizes,
)
from compile.profiles import profile_shapes
from engine.plans.graphs import GRID_SAMPLE_SCOPE, LMDM_BATCH, RENDER_BATCH, SPECS
from tests.compile.precision import Evaluation, evaluate, relative_error

pytestmark = pytest.mark.slow  # the shared export of all six graphs takes about a minute

# ORT's float32 error against float64 may be this many times PyTorch's own float32 error on the
# same inputs (different summation orders; measured ratios 0.9-1.7), plus a few float32 ulps for
# outputs PyTorch happens to round exactly. A wrong op is off by 1e-2 or more.
ORT_OVER_TORCH_FACTOR = 4.0
ULP_FLOOR = 1e-6
# PyTorch's float32 against its own float64 run: beyond this the two runs are not the same computation.
TORCH_FLOAT32_SANITY = 1e-3
NETWORKS = ("appearance_extractor", "motion_extractor", "warp_network", "decoder", "stitch_network", "lmdm")


def onnx_ops(path: Path) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


def run_onnx(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)


def graph_inputs(checkpoints: Path, name: str, batch: int) -> dict[str, torch.Tensor]:
    spec = SPECS[name]
    return example_inputs(spec, symbol_sizes(load_graph_networks(spec, checkpoints)), batch, seed=1)


@functools.cache
def pytorch_evaluation(checkpoints: Path, name: str, batch: int) -> Evaluation:
    """The graph's modules in float32 and float64 on the test inputs (cached: float64 warp takes a minute)."""
    module = GraphModule(SPECS[name], load_graph_networks(SPECS[name], checkpoints)).eval()
    return evaluate(module, graph_inputs(checkpoints, name, batch))


def assert_matches_pytorch(path: Path, checkpoints: Path, name: str, batch: int) -> None:
    """ORT's float32 error against the float64 module is within a small factor of PyTorch's float32 error."""
    spec = SPECS[name]
    got = run_onnx(path, {k: v.numpy() for k, v in graph_inputs(checkpoints, name, batch).items()})
    evaluation = pytorch_evaluation(checkpoints, name, batch)
    for output, value, float32, exact in zip(spec.output_names, got, evaluation.float32, evaluation.float64):
        assert value.shape == exact.shape, output
        torch_error, ort_error = relative_error(float32, exact), relative_error(value, exact)
        assert torch_error < TORCH_FLOAT32_SANITY, f"{name}.{output}: float32 PyTorch is {torch_error:.2e} off float64"
        bound = ORT_OVER_TORCH_FACTOR * torch_error + ULP_FLOOR
        assert ort_error <= bound, (
            f"{name}.{output} at batch {batch}: ORT is {ort_error:.2e} off float64, "
            f"float32 PyTorch {torch_error:.2e} (bound {bound:.2e})"
        )


@pytest.mark.parametrize(
    ("name", "batch"),
    [
        ("appearance_extractor", 1),
        ("motion_extractor", 1),
        ("stitch_network", 2),  # dynamic batch
        ("warp_network", 2),  # dynamic batch on a big graph
        ("decoder", 1),
        ("lmdm", 1),
    ],
)
def test_graph_equals_pytorch(onnx_build, name: str, batch: int) -> None:
    assert_matches_pytorch(onnx_build.onnx_dir / f"{name}.onnx", onnx_build.checkpoints, name, batch)


def test_lmdm_batches_windows_of_several_sessions(onnx_build) -> None:
    assert_matches_pytorch(onnx_build.onnx_dir / "lmdm.onnx", onnx_build.checkpoints, "lmdm", 2)


def test_stitch_network_takes_any_batch_in_its_range(onnx_build) -> None:
    for batch in (1, 7, RENDER_BATCH[2]):
        path = onnx_build.onnx_dir / "stitch_network.onnx"
        assert_matches_pytorch(path, onnx_build.checkpoints, "stitch_network", batch)


@pytest.mark.parametrize("name", NETWORKS)
def test_io_names_dtypes_and_profiles_match_the_spec(onnx_build, name: str) -> None:
    spec = SPECS[name]
    path = onnx_build.onnx_dir / f"{name}.onnx"
    check_graph_io(spec, path)
    inputs, outputs = graph_io(path)
    assert [dtype for _, dtype in inputs.values()] == [t.dtype for t in spec.inputs]
    low, _, high = profile_shapes(spec, {n: dims for n, (dims, _) in inputs.items()})[spec.input_names[0]]
    single = (1, 1, 1)
    expected = {"lmdm": LMDM_BATCH, "appearance_extractor": single, "motion_extractor": single}.get(name, RENDER_BATCH)
    assert (low[0], high[0]) == (expected[0], expected[2])
    assert all(dims[0] == ("batch" if spec.dynamic_batch else 1) for dims, _ in outputs.values())


def test_constants_are_folded_before_tensorrt_sees_them(onnx_build) -> None:
    assert "BatchNormalization" not in onnx_ops(onnx_build.onnx_dir / "warp_network.onnx")
    # Only the pre-activation norms of the six 3-D resblocks stay: no convolution precedes them.
    assert onnx_ops(onnx_build.onnx_dir / "appearance_extractor.onnx")["BatchNormalization"] == 6
    decoder = onnx_ops(onnx_build.onnx_dir / "decoder.onnx")
    assert decoder["InstanceNormalization"] > 0
    assert not {"MatMul", "ReduceL2", "Div"} & set(decoder)  # no spectral-norm sigma subgraphs left


def test_warp_gather_graph_needs_no_gridsample_op(onnx_build) -> None:
    model = onnx.load(str(onnx_build.onnx_dir / "warp_network.onnx"), load_external_data=False)
    ops = collections.Counter(node.op_type for node in model.graph.node)
    assert "GridSample" not in ops
    assert ops["Floor"] == 6  # two samples, three axes each
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    floors = [n.name for n in model.graph.node if n.op_type == "Floor"]
    assert all(GRID_SAMPLE_SCOPE in n for n in floors)
    assert sum("dense_motion_network" in n for n in floors) == 3  # one sample inside the dense motion, one after


def test_warp_exports_with_opset20_gridsample_too(onnx_build, tmp_path: Path) -> None:
    spec = SPECS["warp_network"]
    path = export_graph(spec, load_graph_networks(spec, onnx_build.checkpoints), tmp_path / "warp20.onnx", "opset20")
    model = onnx.load(str(path))
    samples = [n for n in model.graph.node if n.op_type == "GridSample"]
    assert len(samples) == 2 and [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [20]
    assert all({a.name: a for a in n.attribute}["align_corners"].i == 0 for n in samples)
    assert_matches_pytorch(path, onnx_build.checkpoints, "warp_network", 2)  # the gather graph's inputs


def test_warp_and_decoder_compose_into_one_graph(onnx_build, tmp_path: Path) -> None:
    parts = [onnx.load(str(onnx_build.onnx_dir / f"{n}.onnx")) for n in ("warp_network", "decoder")]
    warp, decoder = onnx_build.onnx_dir / "warp_network.onnx", onnx_build.onnx_dir / "decoder.onnx"
    path = merge_warp_decoder(warp, decoder, tmp_path / "m.onnx")
    check_graph_io(SPECS["warp_decoder"], path)
    merged = onnx.load(str(path))
    assert len(merged.graph.node) == sum(len(p.graph.node) for p in parts)
    assert len(merged.graph.initializer) == sum(len(p.graph.initializer) for p in parts)
    fed_by_warp = [n for n in merged.graph.node if "out" in n.input]
    assert fed_by_warp and all(n.name.startswith("decoder:") for n in fed_by_warp)  # warp `out` is decoder `feature`
    assert not any("feature" in n.input for n in merged.graph.node)
    # The parts equal PyTorch (above); the composition must compute exactly decoder(warp(.)) of the parts.
    inputs = {k: v.numpy() for k, v in example_inputs(SPECS["warp_decoder"], {}, batch=1, seed=2).items()}
    (warped,) = run_onnx(onnx_build.onnx_dir / "warp_network.onnx", inputs)
    (expected,) = run_onnx(onnx_build.onnx_dir / "decoder.onnx", {"feature": warped})
    (got,) = run_onnx(path, inputs)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()  # float reassociation in ORT only

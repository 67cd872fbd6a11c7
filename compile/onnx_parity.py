"""Prove an ONNX graph against our PyTorch modules in onnxruntime (CPU), before a plan is built from it.

The reference is the float32 PyTorch modules: PyTorch runs float16 convolutions on the CPU
hundreds of times slower than float32 (the decoder did not finish in 10 minutes on 2 cores).
Float16 inputs of the graph are rounded to float16 for the reference too, so the comparison
measures the graph's own arithmetic. ``FP16_TOLERANCE`` is justified in docs/tensorrt.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from compile.export import GraphModule, example_inputs, load_graph_networks, symbol_sizes
from engine.plans.graphs import GraphSpec

# max |graph - torch| / max |torch| allowed for an FP16 graph against the FP32 modules: about twice the
# warp's error on random weights (its FP16 convolutions), the largest of the graphs.
FP16_TOLERANCE = 2e-2


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    """max |got - expected| / max |expected|, in float32."""
    expected = expected.astype(np.float32)
    return float(np.abs(got.astype(np.float32) - expected).max() / max(float(np.abs(expected).max()), 1e-12))


def onnx_vs_pytorch(
    spec: GraphSpec, onnx_path: str | Path, checkpoints: str | Path, batch: int = 1, seed: int = 1
) -> dict[str, float]:
    """Relative error of each output of the graph at ``onnx_path`` against the float32 modules."""
    networks = load_graph_networks(spec, checkpoints)
    inputs = example_inputs(spec, symbol_sizes(networks), batch, seed)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # leave the cores to PyTorch after
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    half = {i.name for i in session.get_inputs() if i.type == "tensor(float16)"}
    feed = {name: value.numpy().astype(np.float16) if name in half else value.numpy() for name, value in inputs.items()}
    got = session.run(None, feed)
    del session
    reference = {
        name: torch.from_numpy(value.astype(np.float32)) if name in half else inputs[name]
        for name, value in feed.items()
    }
    with torch.no_grad():
        expected = GraphModule(spec, networks).eval()(*reference.values())
    expected = expected if isinstance(expected, tuple) else (expected,)
    return {name: relative_error(value, ref.numpy()) for name, value, ref in zip(spec.output_names, got, expected)}

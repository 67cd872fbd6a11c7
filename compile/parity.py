"""``python -m compile.parity``: compare every plan's outputs with our PyTorch modules on this GPU.

Both sides get the same deterministic inputs; the PyTorch side runs in float32. The report
gives the relative error (max |plan - torch| / max |torch|) per output against a tolerance
for the plan's precision, and exits 1 when any output is over it. Needs TensorRT and a GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from compile.export import GraphModule, example_inputs, load_graph_networks, symbol_sizes
from compile.onnx_parity import FP16_TOLERANCE
from engine.backends.base import BackendError
from engine.backends.tensorrt_backend import TensorRTBackend
from engine.engine import models_dir
from engine.networks import CheckpointError
from engine.plans.graphs import SPECS

# Relative error allowed per plan precision (fp32 plans are built without TF32); an fp16 plan is held
# to what its FP16 graph met in onnxruntime before it was built.
TOLERANCE: dict[str, float] = {"fp32": 1e-3, "fp16": FP16_TOLERANCE}


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| / max |expected|, in float32."""
    expected = expected.float()
    scale = expected.abs().max().clamp_min(1e-12)
    return float((got.float() - expected).abs().max() / scale)


def compare_graph(backend: TensorRTBackend, graph: str, checkpoints: Path, batch: int, seed: int) -> dict[str, float]:
    """Relative error of each output of one plan against the float32 PyTorch modules it was built from."""
    spec = SPECS[graph]
    networks = load_graph_networks(spec, checkpoints)
    module = GraphModule(spec, networks).to(backend.device).eval()
    inputs = {k: v.to(backend.device) for k, v in example_inputs(spec, symbol_sizes(networks), batch, seed).items()}
    got = backend.run(graph, **inputs)
    with torch.no_grad():
        expected = module(*inputs.values())
    expected = expected if isinstance(expected, tuple) else (expected,)
    torch.cuda.synchronize(backend.device)
    return {name: relative_error(got[name], ref) for name, ref in zip(spec.output_names, expected)}


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line per plan output; 0 when all are within tolerance, 1 when not, 2 when it cannot run."""
    parser = argparse.ArgumentParser(prog="python -m compile.parity", description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=Path, required=True, help="a plan directory, or the root holding them (plans/)")
    parser.add_argument("--checkpoints", type=Path, required=True, help="the checkpoints the plans were built from")
    parser.add_argument("--networks", nargs="+", choices=sorted(n for n, s in SPECS.items() if s.exported))
    parser.add_argument("--batch", type=int, default=2, help="batch for plans with a batch range (clipped to it)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    checkpoints = models_dir(args.checkpoints)
    try:
        backend = TensorRTBackend(args.plans, checkpoints)
        graphs = args.networks or [g for g in backend.graphs if SPECS[g].exported]
        failed = False
        print(f"plans: {backend.plan_dir}")
        for graph in graphs:
            low, high = backend.batch_range(graph)
            batch = min(max(args.batch, low), high)
            tolerance = TOLERANCE[SPECS[graph].precision]
            for output, error in compare_graph(backend, graph, checkpoints, batch, args.seed).items():
                ok = error <= tolerance
                failed |= not ok
                print(
                    f"{graph:22s} {output:12s} batch {batch}  rel err {error:.2e}  (tolerance {tolerance:.0e})  "
                    + ("ok" if ok else "OVER"),
                    flush=True,
                )
    except (BackendError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

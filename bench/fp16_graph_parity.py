"""The FP16 ONNX graphs against PyTorch's own FP16 path: is the graph's error the error FP16 costs anyway?

``python -m bench.fp16_graph_parity [--checkpoints DIR] [--batch N] [--out FILE.json]`` exports
the decoder and warp graphs, derives their FP16 graphs (``compile.fp16``), runs them in
onnxruntime (CPU) and compares them with the float32 modules and, on a CUDA GPU, with the torch
backend's FP16 path (the numerical reference of the TensorRT plans). Relative errors are
max |a - b| / max |b|. Random weights unless --checkpoints. Prints a table last; JSON on --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from compile.export import GraphModule, example_inputs, export_fp16, export_network, load_graph_networks, symbol_sizes
from compile.onnx_parity import relative_error
from engine.backends.torch_backend import TorchBackend
from engine.engine import random_checkpoints
from engine.plans.graphs import SPECS

GRAPHS = ("decoder", "warp_network")


def _onnx_fp16(path: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    half = {i.name for i in session.get_inputs() if i.type == "tensor(float16)"}
    (out,) = session.run(None, {n: v.astype(np.float16) if n in half else v for n, v in inputs.items()})
    return out.astype(np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fp16_graph_parity", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints (default: deterministic random weights)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    checkpoints = args.checkpoints or random_checkpoints()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in GRAPHS:
            spec = SPECS[name]
            fp32_path = export_network(name, checkpoints, Path(work) / f"{name}.onnx")
            fp16_path = export_fp16(spec, fp32_path, Path(work) / f"{name}.fp16.onnx")
            networks = load_graph_networks(spec, checkpoints)
            inputs = example_inputs(spec, symbol_sizes(networks), args.batch, seed=1)
            inputs = {n: v.half().float() if n in spec.half_io else v for n, v in inputs.items()}  # as bound
            graph = _onnx_fp16(fp16_path, {n: v.numpy() for n, v in inputs.items()})
            with torch.no_grad():
                module = GraphModule(spec, networks).to(device).eval()
                fp32 = module(*(v.to(device) for v in inputs.values())).float().cpu().numpy()
            row = {"graph": name, "batch": args.batch, "onnx_fp16_vs_torch_fp32": relative_error(graph, fp32)}
            if cuda:
                backend = TorchBackend(checkpoints, device=device, networks=(name,), compile_networks=False)
                call = backend.decode if name == "decoder" else backend.warp
                half = call(*(v.to(device) for v in inputs.values())).float().cpu().numpy()
                row["torch_fp16_vs_torch_fp32"] = relative_error(half, fp32)
                row["onnx_fp16_vs_torch_fp16"] = relative_error(graph, half)
            rows.append(row)
    result = {"gpu": torch.cuda.get_device_name(0) if cuda else None, "torch": torch.__version__, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    titles = ("ONNX fp16 vs torch fp32", "torch fp16 vs fp32", "ONNX fp16 vs torch fp16")
    print(f"{'graph':14s} " + " ".join(f"{t:>{w}s}" for t, w in zip(titles, (24, 19, 24))))
    for row in rows:
        keys = ("onnx_fp16_vs_torch_fp32", "torch_fp16_vs_torch_fp32", "onnx_fp16_vs_torch_fp16")
        cells = [row.get(k) for k in keys]
        print(
            f"{row['graph']:14s} "
            + " ".join(f"{'n/a (no GPU)' if c is None else f'{c:.2e}':>{w}s}" for c, w in zip(cells, (24, 19, 24)))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

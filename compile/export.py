"""Export the networks to ONNX with the I/O names, batch axes and opsets TensorRT plans are built from.

Each graph is traced (TorchScript exporter) from our own modules loaded from the checkpoints,
with BatchNorm and spectral norm folded. The warp network's two 5-D grid samples export either
as the trilinear gather subgraph of ``compile.trilinear`` (``gather``, opset 17, default) or as
opset 20's ``GridSample`` node (``opset20``). ``warp_decoder``, warp and decode in one graph, is
composed from the two exported graphs rather than traced again. Graphs whose plans are FP16 also
get an FP16 graph derived from the FP32 export (``compile.fp16``): tracing the modules in half
precision would run them in half precision on the CPU, which takes minutes per graph.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import onnx
import onnx.compose
import onnx.version_converter
import torch
from torch import nn

import engine.networks as networks_package
from compile import trilinear
from compile.fp16 import spec_to_fp16
from compile.trilinear import TrilinearGridSample
from engine.networks import OFFICIAL_FILENAMES, load_network
from engine.plans import graphs
from engine.plans.graphs import BATCH, SPECS, GraphSpec

GRID_SAMPLE_OPSETS: dict[str, int] = {"gather": 17, "opset20": 20}
BASE_OPSET = 17


class ExportError(RuntimeError):
    """A graph could not be exported, or the exported graph does not match its spec."""


def uses_grid_sample(spec: GraphSpec) -> bool:
    """Whether the graph contains the warp network (and so its 5-D grid samples)."""
    return "warp_network" in spec.checkpoints


@functools.cache
def source_sha256() -> str:
    """sha256 over the source of the exporter, the sampler, the specs and every network module,
    so that any change to the code that writes the graphs re-exports them."""
    files = sorted(Path(networks_package.__file__).parent.glob("*.py"))
    files += [Path(__file__), Path(graphs.__file__), Path(trilinear.__file__)]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def export_settings(spec: GraphSpec, grid_sample: str) -> dict[str, object]:
    """What determines an exported graph besides its checkpoints; a change means re-export."""
    if grid_sample not in GRID_SAMPLE_OPSETS:
        raise ExportError(f"grid sample mode {grid_sample!r} is not one of {sorted(GRID_SAMPLE_OPSETS)}")
    warp = uses_grid_sample(spec)
    return {
        "source_sha256": source_sha256(),
        "torch": torch.__version__.split("+")[0],
        "opset": GRID_SAMPLE_OPSETS[grid_sample] if warp else BASE_OPSET,
        "grid_sample": grid_sample if warp else None,
    }


class GraphModule(nn.Module):
    """The networks of one graph as one module with the graph's inputs and outputs.

    It also holds the trilinear sampler, so exported node names carry its module scope.
    """

    def __init__(self, spec: GraphSpec, networks: Mapping[str, nn.Module]) -> None:
        super().__init__()
        self.spec_name = spec.name
        self.networks = nn.ModuleDict(dict(networks))
        self.grid_sample = TrilinearGridSample()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.spec_name == "warp_decoder":
            return self.networks["decoder"](self.networks["warp_network"](*inputs))
        return self.networks[self.spec_name](*inputs)


@contextlib.contextmanager
def _trilinear_grid_sample(warp: nn.Module, sampler: nn.Module) -> Iterator[None]:
    """Route the warp network's two 5-D grid samples through ``sampler`` while the graph is traced.

    The warp network calls its ``sample_volume`` attribute for both samples; a plain callable
    (not the module itself) goes there, so the sampler keeps its own scope in node names.
    """
    original = warp.sample_volume
    warp.sample_volume = sampler.__call__
    try:
        yield
    finally:
        warp.sample_volume = original


def load_graph_networks(spec: GraphSpec, checkpoints_dir: str | Path) -> dict[str, nn.Module]:
    """The fp32 CPU modules a graph is made of, loaded from the official files with BatchNorm folded."""
    directory = Path(checkpoints_dir)
    return {
        name: load_network(name, directory / OFFICIAL_FILENAMES[name], fold_batchnorm=True) for name in spec.checkpoints
    }


def symbol_sizes(networks: Mapping[str, nn.Module]) -> dict[str, int]:
    """Sizes a checkpoint fixes (shape entries named in the specs), read from the loaded modules."""
    sizes = {}
    if "lmdm" in networks:
        sizes["cond_width"] = int(networks["lmdm"].cond_dim)
    return sizes


def example_inputs(spec: GraphSpec, sizes: Mapping[str, int], batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic inputs in each input's natural range (images in [0,1], keypoints in [-0.8,0.8], ...)."""
    generator = torch.Generator().manual_seed(seed)
    inputs = {}
    for tensor in spec.inputs:
        shape = tuple(batch if d == BATCH else sizes[d] if isinstance(d, str) else d for d in tensor.shape)
        if tensor.name == "time_cond":
            inputs[tensor.name] = torch.randint(0, 1000, shape, generator=generator)
        elif tensor.name == "image":
            inputs[tensor.name] = torch.rand(shape, generator=generator)
        elif tensor.name.startswith("kp_"):
            inputs[tensor.name] = torch.rand(shape, generator=generator) * 1.6 - 0.8
        else:
            inputs[tensor.name] = torch.randn(shape, generator=generator)
    return inputs


TensorInfo = dict[str, tuple[tuple[int | str, ...], str]]


def graph_io(path: str | Path) -> tuple[TensorInfo, TensorInfo]:
    """Inputs and outputs of an ONNX file: name -> (shape with dim names for dynamic axes, numpy dtype name)."""
    model = onnx.load(str(path), load_external_data=False)

    def describe(values: list[onnx.ValueInfoProto]) -> TensorInfo:
        described = {}
        for value in values:
            tensor_type = value.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tensor_type.shape.dim)
            described[value.name] = (dims, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name)
        return described

    initializers = {i.name for i in model.graph.initializer}
    return describe([v for v in model.graph.input if v.name not in initializers]), describe(list(model.graph.output))


def check_graph_io(spec: GraphSpec, path: str | Path, fp16: bool = False) -> None:
    """Raise ExportError unless the file's I/O names, ranks and dtypes are the spec's (those of
    its FP16 graph when ``fp16``)."""
    inputs, outputs = graph_io(path)
    for kind, found, expected in (("inputs", inputs, spec.inputs), ("outputs", outputs, spec.outputs)):
        if tuple(found) != tuple(t.name for t in expected):
            raise ExportError(f"{spec.name}: {path} has {kind} {list(found)}, expected {[t.name for t in expected]}")
        for tensor in expected:
            dims, dtype = found[tensor.name]
            wanted = spec.plan_dtype(tensor) if fp16 else tensor.dtype
            if len(dims) != len(tensor.shape) or dtype != wanted:
                raise ExportError(
                    f"{spec.name}: {path} {tensor.name} is {dtype}{list(dims)}, expected {wanted}{list(tensor.shape)}"
                )


def _check_and_move(spec: GraphSpec, tmp: Path, path: Path, fp16: bool = False) -> Path:
    """Validate the freshly written ``tmp`` and move it to ``path``; a bad graph is deleted, never left in place."""
    try:
        onnx.checker.check_model(str(tmp))
        check_graph_io(spec, tmp, fp16)
    except Exception:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def export_graph(
    spec: GraphSpec, networks: Mapping[str, nn.Module], path: str | Path, grid_sample: str = "gather"
) -> Path:
    """Trace ``networks`` into ONNX at ``path`` (atomically) with the spec's names and batch axis; returns the path."""
    if not spec.exported:
        raise ExportError(f"{spec.name} is taken as published (ONNX), not exported from PyTorch")
    settings = export_settings(spec, grid_sample)
    path = Path(path)
    graph = GraphModule(spec, networks).eval()
    inputs = example_inputs(spec, symbol_sizes(networks), batch=1)
    batched = [t.name for t in (*spec.inputs, *spec.outputs) if t.shape[0] == BATCH]
    dynamic_axes = {name: {0: BATCH} for name in batched} if spec.dynamic_batch else None
    substitute = uses_grid_sample(spec) and grid_sample == "gather"
    sampler = (
        _trilinear_grid_sample(graph.networks["warp_network"], graph.grid_sample)
        if substitute
        else contextlib.nullcontext()
    )
    tmp = path.with_suffix(".onnx.tmp")
    with (
        sampler,
        warnings.catch_warnings(),
        torch.no_grad(),
    ):
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter announces its successor
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape checks in the modules' forward
        # Notes on constant folding and InstanceNorm's training flag; the tests prove the graphs instead.
        warnings.simplefilter("ignore", UserWarning)
        torch.onnx.export(
            graph,
            tuple(inputs.values()),
            str(tmp),
            dynamo=False,
            opset_version=int(settings["opset"]),
            input_names=list(spec.input_names),
            output_names=list(spec.output_names),
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )
    return _check_and_move(spec, tmp, path)


def export_network(spec_name: str, checkpoints_dir: str | Path, path: str | Path, grid_sample: str = "gather") -> Path:
    """Load the graph's checkpoints from ``checkpoints_dir`` and export it to ``path``."""
    spec = SPECS[spec_name]
    return export_graph(spec, load_graph_networks(spec, checkpoints_dir), path, grid_sample)


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def merge_warp_decoder(warp_path: str | Path, decoder_path: str | Path, path: str | Path) -> Path:
    """Compose the exported warp and decoder graphs into ``warp_decoder`` (warp ``out`` feeds decoder
    ``feature``) at ``path``, atomically; the lower opset is raised to the higher one."""
    spec = SPECS["warp_decoder"]
    warp, decoder = onnx.load(str(warp_path)), onnx.load(str(decoder_path))
    opset = max(_opset(warp), _opset(decoder))
    warp, decoder = (
        m if _opset(m) == opset else onnx.version_converter.convert_version(m, opset) for m in (warp, decoder)
    )
    # Internal names of separately exported graphs may collide ("onnx::Conv_12"); the graph's I/O keep theirs.
    warp = onnx.compose.add_prefix(warp, "warp_network:", rename_inputs=False, rename_outputs=False)
    decoder = onnx.compose.add_prefix(decoder, "decoder:", rename_inputs=False, rename_outputs=False)
    merged = onnx.compose.merge_models(warp, decoder, io_map=[("out", "feature")])
    path = Path(path)
    tmp = path.with_suffix(".onnx.tmp")
    onnx.save(merged, str(tmp))
    return _check_and_move(spec, tmp, path)


def export_fp16(spec: GraphSpec, fp32_path: str | Path, path: str | Path) -> Path:
    """Write the FP16 graph of the exported FP32 graph ``fp32_path`` to ``path`` (atomically)."""
    if spec.precision != "fp16":
        raise ExportError(f"{spec.name} is an fp32 graph; its plan is built from {fp32_path} as it is")
    path = Path(path)
    tmp = path.with_suffix(".onnx.tmp")
    onnx.save(spec_to_fp16(onnx.load(str(fp32_path)), spec), str(tmp))
    return _check_and_move(spec, tmp, path, fp16=True)

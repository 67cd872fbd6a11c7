"""Derive a mixed-precision FP16 ONNX graph from an exported FP32 one, for strongly typed builders.

TensorRT for RTX (and TensorRT 11) take each layer's precision from the graph's own tensor
types, so FP16 has to be written into the graph. Every node computes in FP16 except: nodes a
caller's ``keep_fp32`` selects (the warp's geometry), normalizations (their statistics over
thousands of values overflow FP16), and arithmetic on constants and shapes (no activation flows
through it; builders fold it). Data movement (reshape, gather, concat, ...) follows the type of its input:
a cast commutes with it exactly, so moving data in FP16 only halves its bytes. Weights and
constants take the type of their consumers; a Cast is inserted wherever a producer's type
differs from what a consumer computes in, and once per tensor and type.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.plans.graphs import GraphSpec

FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16

# The heavy compute an FP16 graph is for: FP16 even inside an FP32 scope (the torch path agrees).
HEAVY_COMPUTE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})

# Normalizations accumulate statistics over thousands of values, which overflow FP16: they stay FP32.
NORMALIZATIONS = frozenset({"InstanceNormalization", "LayerNormalization", "GroupNormalization"})
# Ops that only move or select values; they compute nothing, so they take their input's type.
MOVEMENT = frozenset(
    {
        "Reshape",
        "Transpose",
        "Concat",
        "Gather",
        "GatherElements",
        "GatherND",
        "Slice",
        "Split",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Expand",
        "Tile",
        "Identity",
        "DepthToSpace",
        "SpaceToDepth",
        "Pad",
        "Where",
        "Cast",
    }
)
# Inputs that keep their own float type whatever the node computes in (ONNX requires float32 scales).
_OWN_TYPE_INPUTS: dict[str, frozenset[int]] = {"Resize": frozenset({1, 2})}
# Ops whose outputs carry no data dependence on their inputs' values.
_SHAPE_OPS = frozenset({"Shape", "Size"})


class Fp16ConversionError(ValueError):
    """The graph cannot be converted (an input or output to bind as FP16 is missing, or a type is unknown)."""


def keeps_fp32(node_name: str, op_type: str, spec: GraphSpec) -> bool:
    """Whether an FP16 graph keeps this node in FP32: light arithmetic inside one of the spec's FP32
    scopes and outside its FP16 scopes (ONNX node names carry the PyTorch module path)."""
    lowered = node_name.lower()
    return (
        op_type not in HEAVY_COMPUTE
        and any(scope in lowered for scope in spec.fp32_scopes)
        and not any(scope in lowered for scope in spec.fp16_scopes)
    )


def spec_to_fp16(model: onnx.ModelProto, spec: GraphSpec) -> onnx.ModelProto:
    """The FP16 graph of an FP32 export, with the spec's FP32 scopes and half I/O."""
    return to_mixed_fp16(model, lambda node: keeps_fp32(node.name, node.op_type, spec), spec.half_io)


def computed_types(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> the numpy dtype of its first float output ("float16"/"float32"); others are left out."""
    types = _tensor_types(model)
    found = {}
    for node in model.graph.node:
        floats = [types[o] for o in node.output if types.get(o) in (FLOAT, HALF)]
        if floats:
            found[node.name] = "float16" if floats[0] == HALF else "float32"
    return found


def _tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """ONNX element type of every tensor in the graph, from shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
    types.update({i.name: i.data_type for i in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            types[node.output[0]] = node.attribute[0].t.data_type
    return types


def _data_dependent(model: onnx.ModelProto, types: dict[str, int]) -> set[str]:
    """Tensors whose values depend on a float graph input (through anything but Shape/Size)."""
    graph_inputs = {i.name for i in model.graph.input} - {i.name for i in model.graph.initializer}
    dependent = {name for name in graph_inputs if types.get(name) == FLOAT}
    for node in model.graph.node:
        if node.op_type not in _SHAPE_OPS and any(t in dependent for t in node.input):
            dependent.update(node.output)
    return dependent


def to_mixed_fp16(
    model: onnx.ModelProto, keep_fp32: Callable[[onnx.NodeProto], bool], half_io: Collection[str]
) -> onnx.ModelProto:
    """A copy of ``model`` computing in FP16 as the module docstring says; ``half_io`` names the graph
    inputs and outputs bound as FP16 (the others keep their type)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    types = _tensor_types(model)
    io_names = {v.name for v in graph.input} | {v.name for v in graph.output}
    if set(half_io) - io_names:
        raise Fp16ConversionError(f"no graph input or output {sorted(set(half_io) - io_names)} to bind as FP16")
    dependent = _data_dependent(model, types)
    initializers = {i.name: i for i in graph.initializer}
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}

    def computes_in(node: onnx.NodeProto, current: dict[str, int]) -> int:
        if node.op_type in MOVEMENT:
            floats = [current[t] for t in node.input if t and current.get(t) in (FLOAT, HALF)]
            return floats[0] if floats else FLOAT
        if node.op_type in NORMALIZATIONS or keep_fp32(node):
            return FLOAT
        return HALF if any(o in dependent for o in node.output) else FLOAT

    # Pass 1: what each float tensor is produced as, in topological order.
    current: dict[str, int] = {name: t for name, t in types.items() if t not in (FLOAT, HALF)}
    for value in graph.input:
        if types.get(value.name) == FLOAT:
            current[value.name] = HALF if value.name in half_io else FLOAT
    flexible = set(initializers) | set(constants)  # weights and constants become what their consumers want
    wanted_by: dict[str, set[int]] = {}
    node_type: dict[int, int] = {}  # by the node's index in the graph
    for position, node in enumerate(graph.node):
        if node.op_type == "Constant":
            continue
        for name in node.input:
            if name in flexible and types.get(name) == FLOAT:
                current.setdefault(name, FLOAT)
        precision = computes_in(node, current)
        node_type[position] = precision
        for index, name in enumerate(node.input):
            if name in flexible and types.get(name) == FLOAT and index not in _OWN_TYPE_INPUTS.get(node.op_type, ()):
                wanted_by.setdefault(name, set()).add(precision)
        for name in node.output:
            if types.get(name) == FLOAT:
                current[name] = precision
    for name, wanted in wanted_by.items():
        current[name] = HALF if wanted == {HALF} else FLOAT
    for name in flexible:
        if current.get(name) == HALF:
            _to_half(initializers.get(name), constants.get(name))

    # Pass 2: retype what nodes produce and insert the casts consumers need.
    new_nodes: list[onnx.NodeProto] = []
    casts: dict[tuple[str, int], str] = {}

    def cast(name: str, to: int) -> str:
        if (name, to) not in casts:
            casts[(name, to)] = out = f"{name}/as_{'fp16' if to == HALF else 'fp32'}"
            new_nodes.append(helper.make_node("Cast", [name], [out], name=out, to=to))
        return casts[(name, to)]

    for position, node in enumerate(graph.node):
        if node.op_type != "Constant":
            precision = node_type[position]
            for index, name in enumerate(node.input):
                if current.get(name) not in (FLOAT, HALF):
                    continue
                own = index in _OWN_TYPE_INPUTS.get(node.op_type, ())
                target = types[name] if own else precision
                if node.op_type == "Cast":
                    target = current[name]
                if current[name] != target:
                    node.input[index] = cast(name, target)
            if node.op_type == "Cast" and types.get(node.output[0]) == FLOAT:
                for attribute in node.attribute:
                    if attribute.name == "to":
                        attribute.i = current[node.output[0]]
        new_nodes.append(node)
    for value in graph.output:
        if current.get(value.name) in (FLOAT, HALF):
            want = HALF if value.name in half_io else types[value.name]
            if current[value.name] != want:
                produced = f"{value.name}/produced"
                _rename_output(new_nodes, value.name, produced)
                new_nodes.append(helper.make_node("Cast", [produced], [value.name], name=f"{value.name}/cast", to=want))
            value.type.tensor_type.elem_type = want
    for value in graph.input:
        if value.name in current and types.get(value.name) == FLOAT:
            value.type.tensor_type.elem_type = current[value.name]
    del graph.node[:]
    graph.node.extend(new_nodes)
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _to_half(initializer: TensorProto | None, constant: onnx.NodeProto | None) -> None:
    tensor = initializer if initializer is not None else constant.attribute[0].t  # type: ignore[union-attr]
    converted = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name)
    tensor.CopyFrom(converted)


def _rename_output(nodes: list[onnx.NodeProto], old: str, new: str) -> None:
    for node in nodes:
        for index, name in enumerate(node.output):
            if name == old:
                node.output[index] = new
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new

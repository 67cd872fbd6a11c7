"""Which graphs a build makes by default, and each plan's optimization profile from its graph and spec.

The specs themselves (I/O, batch ranges, precision) are the engine's: ``engine.plans.graphs``.
"""

from __future__ import annotations

from engine.networks.checkpoints import NETWORK_NAMES
from engine.plans.graphs import GraphSpec, TensorSpec

DEFAULT_GRAPHS: tuple[str, ...] = NETWORK_NAMES
"""Built by default: the networks the engine loads. ``warp_decoder`` (warp and decode merged into one graph) and
``hubert`` (the published streaming HuBERT, which the engine runs in PyTorch or onnxruntime) only on request."""


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

"""A float64 evaluation of a graph's PyTorch modules, the yardstick both float32 runtimes are measured against.

ONNX Runtime and PyTorch each round in float32 in their own order, and that order changes with
the CPU and the release; comparing one against the other bounds the sum of two rounding noises.
Against float64 each gets its own error, and ORT's is judged relative to PyTorch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# CPU float64 convolution has no oneDNN kernel: the fallback unfolds the whole input at once,
# 25 GB for the warp network's k7 mask convolution. Slabs of output depth bound that.
SLAB_BYTES = 1 << 29


def _triple(value: int | tuple[int, ...]) -> tuple[int, int, int]:
    return (value,) * 3 if isinstance(value, int) else tuple(value)  # type: ignore[return-value]


@contextlib.contextmanager
def float64_conv3d_in_depth_slabs() -> Iterator[None]:
    """Within the block, float64 ``F.conv3d`` computes its output in depth slabs of bounded unfold memory."""
    conv3d = F.conv3d

    def sliced(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
    ) -> torch.Tensor:
        if input.dtype != torch.float64 or isinstance(padding, str):
            return conv3d(input, weight, bias, stride, padding, dilation, groups)
        stride, padding, dilation = _triple(stride), _triple(padding), _triple(dilation)
        padded = F.pad(input, (0, 0, 0, 0, padding[0], padding[0]))
        span = dilation[0] * (weight.shape[2] - 1) + 1
        depth = (padded.shape[2] - span) // stride[0] + 1
        per_plane = input.shape[0] * weight.shape[1] * weight[0, 0].numel() * input.shape[3] * input.shape[4] * 8
        step = max(1, SLAB_BYTES // per_plane)
        slabs = [
            conv3d(
                padded[:, :, start * stride[0] : (min(depth, start + step) - 1) * stride[0] + span],
                weight,
                bias,
                stride,
                (0, padding[1], padding[2]),
                dilation,
                groups,
            )
            for start in range(0, depth, step)
        ]
        return torch.cat(slabs, dim=2)

    with mock.patch.object(F, "conv3d", sliced):
        yield


@dataclass(frozen=True)
class Evaluation:
    """One module's outputs on one set of inputs, in float32 and in float64."""

    float32: tuple[np.ndarray, ...]
    float64: tuple[np.ndarray, ...]


def evaluate(module: nn.Module, inputs: Mapping[str, torch.Tensor]) -> Evaluation:
    """Run ``module`` in float32, then (converted in place) in float64 on the same inputs widened."""

    def run(*args: torch.Tensor) -> tuple[np.ndarray, ...]:
        with torch.no_grad():
            outputs = module(*args)
        return tuple(o.numpy() for o in (outputs if isinstance(outputs, tuple) else (outputs,)))

    float32 = run(*inputs.values())
    module.double()
    with float64_conv3d_in_depth_slabs():
        float64 = run(*(v.double() if v.is_floating_point() else v for v in inputs.values()))
    return Evaluation(float32, float64)


def relative_error(value: np.ndarray, exact: np.ndarray) -> float:
    """max|value − exact| / max|exact|, in float64."""
    return float(np.abs(value.astype(np.float64) - exact).max() / np.abs(exact).max())

"""The trilinear gather sampler equals PyTorch's 5-D grid_sample (zeros padding, align_corners=False)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from compile.trilinear import TrilinearGridSample, grid_sample_3d
from engine.plans.graphs import GRID_SAMPLE_SCOPE

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter's notice


def reference(volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    return F.grid_sample(volume, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


@pytest.mark.parametrize(
    ("volume_shape", "grid_shape"),
    [
        ((1, 32, 16, 64, 64), (1, 16, 64, 64, 3)),  # the warp network's final feature warp
        ((22, 4, 16, 16, 16), (22, 16, 16, 16, 3)),  # the dense-motion layout (22 sparse motions), smaller
        ((2, 3, 5, 7, 9), (2, 4, 6, 3, 3)),  # odd, unequal sizes: catches swapped axes
    ],
)
def test_matches_grid_sample_including_out_of_range_coordinates(volume_shape, grid_shape) -> None:
    generator = torch.Generator().manual_seed(0)
    volume = torch.randn(volume_shape, generator=generator)
    grid = torch.rand(grid_shape, generator=generator) * 2.6 - 1.3  # ~30% of samples touch the zero padding
    expected = reference(volume, grid)
    torch.testing.assert_close(grid_sample_3d(volume, grid), expected, rtol=0, atol=1e-5)


def test_exact_corners_edges_and_far_outside() -> None:
    volume = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(1, 2, 3, 4, 5)
    points = torch.tensor(
        [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [-0.8, 0.75, 1 / 3], [5.0, 0.0, 0.0], [-1.2, -1.3, 0.9]]
    )
    grid = points.reshape(1, 1, 1, -1, 3)
    torch.testing.assert_close(grid_sample_3d(volume, grid), reference(volume, grid), rtol=0, atol=1e-5)
    assert grid_sample_3d(volume, grid)[0, :, 0, 0, 4].abs().max() == 0  # wholly outside: zero


def test_exports_without_gridsample_op_and_runs_in_onnxruntime_with_any_batch(tmp_path) -> None:
    path = tmp_path / "sampler.onnx"
    volume, grid = torch.randn(1, 4, 6, 8, 10), torch.rand(1, 5, 6, 7, 3) * 2.4 - 1.2
    torch.onnx.export(
        TrilinearGridSample(),
        (volume, grid),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["volume", "grid"],
        output_names=["out"],
        dynamic_axes={"volume": {0: "batch"}, "grid": {0: "batch"}, "out": {0: "batch"}},
    )
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert "GridSample" not in ops and {"Floor", "Gather"} <= ops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    volume3, grid3 = torch.randn(3, 4, 6, 8, 10), torch.rand(3, 5, 6, 7, 3) * 2.4 - 1.2
    (out,) = session.run(None, {"volume": volume3.numpy(), "grid": grid3.numpy()})
    np.testing.assert_allclose(out, reference(volume3, grid3).numpy(), rtol=0, atol=1e-5)


def test_module_scope_names_every_exported_node(tmp_path) -> None:
    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.grid_sample = TrilinearGridSample()

        def forward(self, volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
            return self.grid_sample(volume * 2.0, grid)

    path = tmp_path / "held.onnx"
    example = (torch.randn(1, 2, 3, 4, 5), torch.rand(1, 2, 2, 2, 3))
    torch.onnx.export(Holder(), example, str(path), dynamo=False, opset_version=17)
    computing = [n for n in onnx.load(str(path)).graph.node if n.op_type not in ("Constant", "Shape")]
    assert [n.op_type for n in computing if GRID_SAMPLE_SCOPE not in n.name] == ["Mul"]  # the outer `volume * 2.0`

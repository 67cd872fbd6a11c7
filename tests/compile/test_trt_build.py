"""The plan builder up to TensorRT's boundary: clear refusals, target checks, which layers stay FP32."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from compile.profiles import SPECS
from compile.trt_build import (
    BuildOptions,
    BuildTargetError,
    GpuInfo,
    TensorRTUnavailable,
    build_plan,
    check_target,
    import_tensorrt,
    keeps_fp32,
    present_gpu,
)
from engine.backends.base import BackendError

no_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed")
RTX_4090 = GpuInfo(0, "NVIDIA GeForce RTX 4090", 8, 9)
T4 = GpuInfo(0, "Tesla T4", 7, 5)


@no_tensorrt
def test_missing_tensorrt_is_a_backend_error_that_says_how_to_install() -> None:
    with pytest.raises(TensorRTUnavailable, match=r"TensorRT is not installed.*pip install 'tensorrt>=10\.8,<11'") as caught:
        import_tensorrt()
    assert isinstance(caught.value, BackendError)


@no_tensorrt
def test_building_without_tensorrt_stops_at_the_import(tmp_path: Path) -> None:
    with pytest.raises(TensorRTUnavailable):
        build_plan(tmp_path / "x.onnx", tmp_path / "x.plan", SPECS["decoder"], {}, BuildOptions(), tmp_path / "t.cache")
    assert not (tmp_path / "x.plan").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_no_gpu_is_reported_as_such() -> None:
    with pytest.raises(TensorRTUnavailable, match="no CUDA GPU 0 here"):
        present_gpu()


def test_target_is_the_present_gpu_unless_hardware_compatible() -> None:
    check_target(None, RTX_4090, "none")
    check_target("sm_89", RTX_4090, "none")
    with pytest.raises(BuildTargetError) as caught:
        check_target("sm_120", RTX_4090, "none")
    message = str(caught.value)
    assert "asks for plans for sm_120" in message and "NVIDIA GeForce RTX 4090 (sm_89)" in message
    assert "--hardware-compat ampere+" in message
    check_target("sm_120", RTX_4090, "ampere+")


def test_hardware_compatibility_needs_ampere_on_both_sides() -> None:
    with pytest.raises(BuildTargetError, match="Ampere or newer GPUs.*Tesla T4"):
        check_target(None, T4, "ampere+")
    with pytest.raises(BuildTargetError, match="not on sm_75"):
        check_target("sm_75", RTX_4090, "ampere+")


@pytest.mark.parametrize(
    ("name", "layer_type", "pinned"),
    [
        ("/networks.warp_network/dense_motion_network/grid_sample/Mul_3", "ELEMENTWISE", True),
        ("/networks.warp_network/grid_sample/Floor", "UNARY", True),
        ("/networks.warp_network/dense_motion_network/GridSample", "GRID_SAMPLE", True),  # opset 20 node
        ("/networks.warp_network/dense_motion_network/Exp", "UNARY", True),  # keypoint heatmaps
        ("/networks.warp_network/dense_motion_network/Softmax", "SOFTMAX", True),  # the motion blend
        ("/networks.warp_network/grid_sample/Gather_12", "GATHER", False),  # moves data only
        ("/networks.warp_network/grid_sample/Constant_4", "CONSTANT", False),
        ("/networks.warp_network/dense_motion_network/mask/Conv", "CONVOLUTION", False),  # 140 GFLOP: fp16
        ("/networks.warp_network/dense_motion_network/hourglass/encoder/down_blocks.0/Relu", "ACTIVATION", False),
        ("/networks.warp_network/third/conv/Conv", "CONVOLUTION", False),
        ("/networks.warp_network/Mul", "ELEMENTWISE", False),  # the occlusion product, outside the geometry
    ],
)
def test_fp32_pinning_selects_the_warp_geometry(name: str, layer_type: str, pinned: bool) -> None:
    assert keeps_fp32(name, layer_type, SPECS["warp_network"]) is pinned


def test_no_layer_of_other_graphs_is_pinned() -> None:
    for spec in SPECS.values():
        if spec.name not in ("warp_network", "warp_decoder"):
            assert not keeps_fp32("/networks.decoder/G_middle_0/grid_sample/Mul", "ELEMENTWISE", spec)

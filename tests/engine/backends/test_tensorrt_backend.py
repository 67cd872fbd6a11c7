"""The TensorRT backend refuses clearly where it cannot run; binding types map onto torch dtypes."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.backends.base import Backend, BackendError
from engine.backends.tensorrt_backend import TensorRTBackend, torch_dtype


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) for m in ("tensorrt", "tensorrt_rtx")), reason="a TensorRT library is installed"
)
def test_without_tensorrt_loading_raises_a_clear_backend_error(tmp_path) -> None:
    with pytest.raises(BackendError, match=r"TensorRT-RTX is not installed.*pip install tensorrt-rtx-cu13"):
        TensorRTBackend(tmp_path)


@pytest.mark.skipif(not any(importlib.util.find_spec(m) for m in ("tensorrt", "tensorrt_rtx")), reason="no TensorRT")
def test_a_directory_without_plans_says_how_to_build_them(tmp_path) -> None:
    with pytest.raises(BackendError, match=r"no plans in .*python -m compile.build_plans --checkpoints"):
        TensorRTBackend(tmp_path)


def test_the_backend_runs_on_cuda_only(tmp_path) -> None:
    with pytest.raises(BackendError, match="runs on a CUDA device, not cpu"):
        TensorRTBackend(tmp_path, device="cpu")


def test_is_a_backend() -> None:
    assert issubclass(TensorRTBackend, Backend) and TensorRTBackend.name == "tensorrt"


def test_binding_types_map_to_torch() -> None:
    assert torch_dtype("DataType.HALF") is torch.float16
    assert torch_dtype("DataType.FLOAT") is torch.float32
    assert torch_dtype("DataType.INT64") is torch.int64
    with pytest.raises(BackendError, match="FP8"):
        torch_dtype("DataType.FP8")

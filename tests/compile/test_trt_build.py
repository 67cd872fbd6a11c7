"""The plan builder up to TensorRT's boundary: clear refusals, the builder choice, the targets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from compile.trt_build import (
    RTX_DEFAULT_TARGETS,
    BuildOptions,
    BuildTargetError,
    build_plan,
    check_target,
    choose_builder,
    rtx_targets,
)
from engine.backends.base import BackendError
from engine.plans.graphs import SPECS
from engine.plans.libraries import FULL, RTX, TensorRTUnavailable, import_builder
from engine.plans.targets import GpuInfo

no_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed")
RTX_4090 = GpuInfo(0, "NVIDIA GeForce RTX 4090", 8, 9)
H200 = GpuInfo(0, "NVIDIA H200", 9, 0)
T4 = GpuInfo(0, "Tesla T4", 7, 5)
BOTH = {RTX: "1.7.1.116", FULL: "10.8.0"}


@no_tensorrt
def test_missing_tensorrt_is_a_backend_error_that_says_how_to_install() -> None:
    with pytest.raises(TensorRTUnavailable, match=r"TensorRT is not installed.*pip install 'tensorrt>=10\.8,<11'") as e:
        import_builder(FULL)
    assert isinstance(e.value, BackendError)


@no_tensorrt
def test_building_without_tensorrt_stops_at_the_import(tmp_path: Path) -> None:
    options = BuildOptions(builder=FULL, targets=("sm_89",))
    with pytest.raises(TensorRTUnavailable):
        build_plan(tmp_path / "x.onnx", tmp_path / "x.plan", SPECS["decoder"], {}, options, tmp_path / "t.cache")
    assert not (tmp_path / "x.plan").exists()


def test_tensorrt_rtx_is_the_default_and_auto_avoids_it_only_where_it_cannot_run() -> None:
    assert choose_builder("rtx", {}, None) == RTX and choose_builder("tensorrt", {}, None) == FULL
    assert choose_builder("auto", BOTH, None) == RTX  # no GPU: only TensorRT-RTX builds
    assert choose_builder("auto", BOTH, RTX_4090) == RTX
    assert choose_builder("auto", BOTH, H200) == FULL  # TensorRT-RTX plans would not run on this GPU
    assert choose_builder("auto", {RTX: "1.7.1.116"}, H200) == RTX
    assert choose_builder("auto", {FULL: "10.8.0"}, RTX_4090) == FULL
    with pytest.raises(TensorRTUnavailable, match=r"neither TensorRT-RTX nor TensorRT.*tensorrt-rtx-cu13==1\.7\.1"):
        choose_builder("auto", {}, RTX_4090)


def test_tensorrt_rtx_targets_default_to_ampere_and_newer_and_refuse_hopper() -> None:
    assert rtx_targets(None) == RTX_DEFAULT_TARGETS == ("sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
    assert rtx_targets(["sm_89", "sm_120", "sm_89"]) == ("sm_89", "sm_120")
    with pytest.raises(BuildTargetError, match=r"cannot build for sm_90.*--builder tensorrt"):
        rtx_targets(["sm_89", "sm_90"])


def test_full_tensorrt_target_is_the_present_gpu_unless_hardware_compatible() -> None:
    check_target(None, RTX_4090, "none")
    check_target(["sm_89"], RTX_4090, "none")
    with pytest.raises(BuildTargetError) as caught:
        check_target(["sm_120"], RTX_4090, "none")
    message = str(caught.value)
    assert "asks for plans for sm_120" in message and "NVIDIA GeForce RTX 4090 (sm_89)" in message
    assert "--hardware-compat ampere+" in message and "--builder rtx" in message
    check_target(["sm_120"], RTX_4090, "ampere+")


def test_hardware_compatibility_needs_ampere_on_both_sides() -> None:
    with pytest.raises(BuildTargetError, match="Ampere or newer GPUs.*Tesla T4"):
        check_target(None, T4, "ampere+")
    with pytest.raises(BuildTargetError, match="not on sm_75"):
        check_target(["sm_75"], RTX_4090, "ampere+")

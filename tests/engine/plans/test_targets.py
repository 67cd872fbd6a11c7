"""Which GPU runs which plans is decided from the manifest alone, and explained in plain words."""

from __future__ import annotations

import torch

from engine.plans.checks import why_not_here
from engine.plans.libraries import FULL, RTX, installed_builders
from engine.plans.manifest import Manifest
from engine.plans.targets import GpuInfo, describe, describe_all, present_gpu

RTX_4090 = GpuInfo(0, "NVIDIA GeForce RTX 4090", 8, 9)
RTX_5090 = GpuInfo(0, "NVIDIA GeForce RTX 5090", 12, 0)
RTX_3090 = GpuInfo(0, "NVIDIA GeForce RTX 3090", 8, 6)
H200 = GpuInfo(0, "NVIDIA H200", 9, 0)
T4 = GpuInfo(0, "Tesla T4", 7, 5)
HERE = {RTX: "1.7.1.116"}


def rtx_plans(*targets: str) -> Manifest:
    return Manifest(
        kind="plans", checkpoints_dir="/models", builder=RTX, builder_version="1.7.1.116",
        compute_capabilities=list(targets or ("sm_89", "sm_120")),
    )


def full_plans(**overrides) -> Manifest:
    fields = dict(
        kind="plans", checkpoints_dir="/models", builder=FULL, builder_version="10.8.0",
        compute_capabilities=["sm_89"], gpu_name="NVIDIA GeForce RTX 4090",
    )
    return Manifest(**{**fields, **overrides})


def test_tensorrt_rtx_plans_run_on_the_gpus_they_were_built_for() -> None:
    assert why_not_here(rtx_plans(), RTX_4090, HERE) is None
    assert why_not_here(rtx_plans(), RTX_5090, HERE) is None


def test_h200_is_refused_with_the_supported_capabilities_and_the_alternatives() -> None:
    reason = why_not_here(rtx_plans(), H200, HERE)
    assert "NVIDIA H200, has compute capability 9.0 (Hopper: H100, H200), which TensorRT-RTX does not run on" in reason
    assert "compute capability 8.9 (Ada: RTX 40, L4, L40), 12.0 (Blackwell: RTX 50, RTX PRO 6000)" in reason
    assert "--backend torch" in reason
    assert "pip install 'tensorrt>=10.8,<11'" in reason and "--builder tensorrt --checkpoints /models" in reason


def test_no_gpu_is_refused_with_the_supported_capabilities() -> None:
    reason = why_not_here(rtx_plans(), None, HERE)
    assert reason.startswith("this machine has no CUDA GPU")
    assert "compute capability 8.9 (Ada: RTX 40, L4, L40), 12.0" in reason and "--backend torch" in reason


def test_a_gpu_tensorrt_rtx_supports_but_was_not_built_for_is_told_to_rebuild_for_it() -> None:
    reason = why_not_here(rtx_plans(), RTX_3090, HERE)
    assert "has compute capability 8.6 (Ampere: RTX 30, A10, A40)" in reason
    assert "--arch sm_89 sm_120 sm_86" in reason and "no GPU is needed" in reason


def test_the_tensorrt_rtx_version_must_be_the_one_that_built_the_plans() -> None:
    assert "TensorRT-RTX is not installed here" in why_not_here(rtx_plans(), RTX_4090, {})
    reason = why_not_here(rtx_plans(), RTX_4090, {RTX: "1.8.0.1"})
    assert "built with TensorRT-RTX 1.7.1.116, this machine has TensorRT-RTX 1.8.0.1" in reason
    assert "pip install tensorrt-rtx-cu13==1.7.1.116" in reason


def test_full_tensorrt_plans_run_on_the_architecture_that_built_them() -> None:
    assert why_not_here(full_plans(), RTX_4090, {FULL: "10.8.0"}) is None
    reason = why_not_here(full_plans(), RTX_5090, {FULL: "10.8.0"})
    assert "built for sm_89 (NVIDIA GeForce RTX 4090); this GPU (NVIDIA GeForce RTX 5090) is sm_120" in reason
    assert "--hardware-compat ampere+" in reason
    assert "built with TensorRT 10.8.0, this machine has TensorRT 10.9.0" in why_not_here(
        full_plans(), RTX_4090, {FULL: "10.9.0"}
    )
    assert "no CUDA GPU" in why_not_here(full_plans(), None, {FULL: "10.8.0"})


def test_hardware_compatible_plans_run_on_any_ampere_or_newer_gpu() -> None:
    plans = full_plans(hardware_compat="ampere+")
    for gpu in (RTX_3090, RTX_4090, H200, RTX_5090):
        assert why_not_here(plans, gpu, {FULL: "10.8.0"}) is None
    assert "sm_75" in why_not_here(plans, T4, {FULL: "10.8.0"})


def test_an_onnx_directory_holds_no_plans() -> None:
    onnx = Manifest(kind="onnx", checkpoints_dir="/m")
    assert why_not_here(onnx, RTX_4090, HERE) == "it holds ONNX graphs, not plans"


def test_capabilities_are_named_as_people_know_them() -> None:
    assert describe("sm_89") == "compute capability 8.9 (Ada: RTX 40, L4, L40)"
    assert describe("sm_61") == "compute capability 6.1"
    assert describe_all(["sm_80", "sm_120"]) == (
        "compute capability 8.0 (Ampere: A100, A30), 12.0 (Blackwell: RTX 50, RTX PRO 6000)"
    )


def test_this_machine_is_read_as_it_is() -> None:
    gpu = present_gpu()
    assert (gpu is None) == (not torch.cuda.is_available())
    installed = installed_builders()
    assert set(installed) <= {RTX, FULL}
    if RTX in installed:
        import tensorrt_rtx

        assert installed[RTX] == tensorrt_rtx.__version__


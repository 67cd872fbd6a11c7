"""Which GPUs a plan set runs on, and in plain words why this machine cannot run it.

TensorRT-RTX plans are compiled ahead of time, on any machine, for a list of compute
capabilities, and run on those GPUs only; its runtime does not support Hopper or datacenter
Blackwell at all. Full TensorRT plans run on the GPU architecture that built them (or any
Ampere-or-newer GPU when built hardware-compatible). ``why_not_here`` decides from the
manifest, the GPU (or none) and the installed builders alone, so it is tested without a GPU;
``present_gpu`` reads the machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.plans.libraries import BUILDER_TITLES, FULL, INSTALL, RTX, RTX_TARGETS

if TYPE_CHECKING:
    from engine.plans.manifest import Manifest

_FAMILIES = {
    "sm_75": "Turing: RTX 20, T4",
    "sm_80": "Ampere: A100, A30",
    "sm_86": "Ampere: RTX 30, A10, A40",
    "sm_87": "Ampere: Jetson Orin",
    "sm_89": "Ada: RTX 40, L4, L40",
    "sm_90": "Hopper: H100, H200",
    "sm_100": "Blackwell: B200, GB200",
    "sm_120": "Blackwell: RTX 50, RTX PRO 6000",
    "sm_121": "Blackwell: DGX Spark",
}


def compute_capability_name(major: int, minor: int) -> str:
    """``sm_XY`` as CUDA spells it: (8, 9) -> sm_89, (12, 0) -> sm_120."""
    return f"sm_{major}{minor}"


def parse_compute_capability(name: str) -> tuple[int, int]:
    """(major, minor) of an ``sm_XY`` name; the last digit is the minor version."""
    digits = name.removeprefix("sm_")
    if not name.startswith("sm_") or not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"not a compute capability: {name!r} (expected sm_XY, e.g. sm_89 or sm_120)")
    return int(digits[:-1]), int(digits[-1])


@dataclass(frozen=True)
class GpuInfo:
    """The GPU plans are built for or loaded on."""

    index: int
    name: str
    major: int
    minor: int

    @property
    def arch(self) -> str:
        return compute_capability_name(self.major, self.minor)


def present_gpu(index: int = 0) -> GpuInfo | None:
    """The CUDA GPU at ``index``, or None when this machine has none."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() <= index:
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return GpuInfo(index, torch.cuda.get_device_name(index), major, minor)


def describe(arch: str) -> str:
    """``sm_89`` as people know it: "compute capability 8.9 (Ada: RTX 40, L4, L40)"."""
    major, minor = parse_compute_capability(arch)
    family = _FAMILIES.get(arch)
    return f"compute capability {major}.{minor}" + (f" ({family})" if family else "")


def describe_all(archs: Iterable[str]) -> str:
    """"compute capability 8.9 (Ada: RTX 40, L4, L40), 12.0 (Blackwell: RTX 50, RTX PRO 6000)"."""
    return "compute capability " + ", ".join(describe(a).removeprefix("compute capability ") for a in archs)


def alternatives(checkpoints: str) -> str:
    """What to run instead of TensorRT-RTX plans, for a GPU they cannot run on."""
    return (
        "Run with --backend torch instead (any CUDA GPU, and the CPU), or build full-TensorRT plans on "
        f"this machine: {INSTALL[FULL]}, then python -m compile.build_plans --builder tensorrt "
        f"--checkpoints {checkpoints}"
    )


def why_not_here(manifest: Manifest, gpu: GpuInfo | None, installed: Mapping[str, str]) -> str | None:
    """None when the plans of ``manifest`` can run on ``gpu`` with the ``installed`` builders, else why not."""
    if manifest.kind != "plans":
        return "it holds ONNX graphs, not plans"
    if manifest.builder == RTX:
        reason = _rtx_gpu_problem(manifest, gpu)
    else:
        reason = _full_gpu_problem(manifest, gpu)
    return reason or _version_problem(manifest, installed)


def _rtx_gpu_problem(manifest: Manifest, gpu: GpuInfo | None) -> str | None:
    targets = manifest.compute_capabilities
    supported = describe_all(targets)
    if gpu is None:
        return (
            f"this machine has no CUDA GPU; these TensorRT-RTX plans run on GPUs of {supported}. "
            "Without a GPU the engine runs with --backend torch (on the CPU, slowly)"
        )
    if gpu.arch in targets:
        return None
    if gpu.arch in RTX_TARGETS:
        return (
            f"this GPU, {gpu.name}, has {describe(gpu.arch)}; the plans were built for {supported} only. "
            f"Rebuild them with --arch {' '.join([*targets, gpu.arch])} (no GPU is needed to build)"
        )
    return (
        f"this GPU, {gpu.name}, has {describe(gpu.arch)}, which TensorRT-RTX does not run on; these plans run "
        f"on {supported}. {alternatives(manifest.checkpoints_dir)}"
    )


def _full_gpu_problem(manifest: Manifest, gpu: GpuInfo | None) -> str | None:
    built_for = manifest.compute_capabilities[0] if manifest.compute_capabilities else "an unknown GPU"
    if gpu is None:
        return (
            f"this machine has no CUDA GPU; full-TensorRT plans run on the GPU that built them ({built_for}, "
            f"{manifest.gpu_name}). Without a GPU the engine runs with --backend torch"
        )
    if manifest.hardware_compat == "ampere+":
        if gpu.major >= 8:
            return None
        return (
            f"the plans are hardware-compatible for Ampere and newer GPUs (sm_80+); this GPU ({gpu.name}) is "
            f"{gpu.arch}. Build plans on this GPU without --hardware-compat."
        )
    if built_for == gpu.arch:
        return None
    return (
        f"the plans were built for {built_for} ({manifest.gpu_name}); this GPU ({gpu.name}) is {gpu.arch}. "
        "Full-TensorRT plans run on the GPU architecture that built them: rebuild them on this machine, or "
        "build once with --hardware-compat ampere+ for plans that run on any Ampere-or-newer GPU"
    )


def _version_problem(manifest: Manifest, installed: Mapping[str, str]) -> str | None:
    builder = manifest.builder or FULL
    title = BUILDER_TITLES[builder]
    have = installed.get(builder)
    if have == manifest.builder_version:
        return None
    pin = f"pip install {'tensorrt-rtx-cu13' if builder == RTX else 'tensorrt'}=={manifest.builder_version}"
    if have is None:
        return f"{title} is not installed here; the plans need {title} {manifest.builder_version}: {pin}"
    return (
        f"the plans were built with {title} {manifest.builder_version}, this machine has {title} {have}; "
        f"a plan only loads in the {title} version that built it. Rebuild all plans, or {pin}"
    )

"""The GPUs plans are built for: compute capability names, the families they stand for, this machine's GPU.

TensorRT-RTX plans are compiled ahead of time, on any machine, for a list of compute
capabilities, and run on those GPUs only; its runtime does not support Hopper or datacenter
Blackwell at all. Full TensorRT plans run on the GPU architecture that built them (or any
Ampere-or-newer GPU when built hardware-compatible). ``present_gpu`` reads the machine;
``engine.plans.checks.why_not_here`` decides from a manifest and the GPU whether its plans run here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


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

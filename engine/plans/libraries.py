"""The two libraries that build and run plans, TensorRT-RTX and full TensorRT: names, versions, how to get them.

They are imported only when a plan is built or loaded, never when the package is.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from engine.backends.base import BackendError

# The libraries as manifests name them, and the build_plans --builder choice for each.
RTX, FULL = "tensorrt-rtx", "tensorrt"
BUILDER_OPTIONS = {RTX: "rtx", FULL: "tensorrt"}
BUILDER_TITLES = {RTX: "TensorRT-RTX", FULL: "TensorRT"}
MODULES = {RTX: "tensorrt_rtx", FULL: "tensorrt"}
RTX_VERSION = "1.7.1.116"
INSTALL = {
    RTX: f"pip install tensorrt-rtx-cu13=={RTX_VERSION}",
    FULL: "pip install 'tensorrt>=10.8,<11'",
}
RTX_TARGETS: tuple[str, ...] = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
"""The compute capabilities TensorRT-RTX 1.x compiles for and runs on (its ComputeCapability enum)."""
_WHERE = {
    RTX: "any machine, no GPU needed; its plans run on RTX 20-50 and Ampere GPUs",
    FULL: "a machine with the NVIDIA GPU and driver that will run the plans; 10.8 is the first with sm_120 kernels",
}


class TensorRTUnavailable(BackendError):
    """TensorRT (or the GPU it needs) is not available on this machine."""


def installed_builders() -> dict[str, str]:
    """The plan libraries importable here and their versions, e.g. {"tensorrt-rtx": "1.7.1.116"}."""
    found = {}
    for builder, module in MODULES.items():
        try:
            found[builder] = str(importlib.import_module(module).__version__)
        except Exception:  # a broken install raises OSError or RuntimeError from its loader, not only ImportError
            continue
    return found


def import_builder(builder: str) -> ModuleType:
    """The library that builds and loads ``builder`` plans, or a TensorRTUnavailable that says how to get it."""
    title = BUILDER_TITLES[builder]
    try:
        trt = importlib.import_module(MODULES[builder])
    except Exception as exc:  # a broken install raises OSError or RuntimeError from its loader, not only ImportError
        raise TensorRTUnavailable(
            f"{title} is not installed here ({type(exc).__name__}: {exc}); install it on {_WHERE[builder]}: "
            f"{INSTALL[builder]}"
        ) from exc
    if builder == FULL and int(str(trt.__version__).split(".")[0]) < 10:
        raise TensorRTUnavailable(f"TensorRT {trt.__version__} is too old: the plans need TensorRT 10; {INSTALL[FULL]}")
    return trt

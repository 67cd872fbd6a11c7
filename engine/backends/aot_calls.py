"""The torch backend's bucketed calls as plain-tensor modules: what ``compile.aot_build`` exports, and the inputs it
exports them with.

A compiled package takes and returns flat tensors only (a package keeps no Python types), so the LMDM window that
``FusedLMDMStep`` passes around as a ``FusedWindow`` crosses a package as its four tensors, in field order; and its
kernels assume the strides they were compiled for, so every input crosses it contiguous (``contiguous``). A package
holds no weights: it runs on the tensors of the modules it was exported from, by name (``module_tensors``), so every
bucket shares the backend's one copy.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from engine.diffusion.schedule import DDIMSchedule
from engine.motion.vector import MOTION_DIM
from engine.networks.lmdm_fused import FusedLMDMStep, FusedWindow
from engine.timebase import SEQ_FRAMES

FEATURE_SHAPE = (32, 16, 64, 64)
"""One frame's 3-D appearance feature (C, D, H, W), the warp network's input."""
KEYPOINTS = (21, 3)


class PrepareCall(nn.Module):
    """``FusedLMDMStep.prepare_window`` with the window returned as a tuple of its tensors."""

    def __init__(self, fused: FusedLMDMStep) -> None:
        super().__init__()
        self.fused = fused

    def forward(self, cond: torch.Tensor, times: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.fused.prepare_window(cond, times))


class StepCall(nn.Module):
    """``FusedLMDMStep.ddim_step`` with the window passed as its four tensors."""

    def __init__(self, fused: FusedLMDMStep) -> None:
        super().__init__()
        self.fused = fused

    def forward(
        self,
        x: torch.Tensor,
        cond_frame: torch.Tensor,
        cross_kv: torch.Tensor,
        time_kv: torch.Tensor,
        modulation: torch.Tensor,
        step_of_time: torch.Tensor,
        time_cond: torch.Tensor,
        coefficients: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        window = FusedWindow(cross_kv, time_kv, modulation, step_of_time)
        return self.fused.ddim_step(x, cond_frame, window, time_cond, coefficients, noise)


class RenderCall(nn.Module):
    """Warp then decode; its inputs come in the networks' dtype (the backend casts them before the call)."""

    def __init__(self, warp: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        self.warp, self.decoder = warp, decoder

    def forward(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.warp(feature_3d, kp_source, kp_driving))


def module_tensors(module: nn.Module) -> Mapping[str, torch.Tensor]:
    """Every tensor ``module`` holds, by its dotted path, as ``torch.export`` names them: parameters, buffers and plain
    tensor attributes, under every path by which a shared one is reached."""
    tensors = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        held = {
            **{k: v for k, v in vars(sub).items() if isinstance(v, torch.Tensor)},
            **sub._parameters,
            **sub._buffers,
        }
        tensors.update({f"{prefix}.{name}" if prefix else name: t for name, t in held.items() if t is not None})
    return tensors


def step_inputs(fused: FusedLMDMStep, schedule: DDIMSchedule, batch: int, cond_width: int) -> tuple[torch.Tensor, ...]:
    """Example inputs of ``StepCall`` for ``batch`` windows (zeros: the package's shapes and dtypes are what count)."""
    device = schedule.times.device
    window = fused.prepare_window(torch.zeros(batch, SEQ_FRAMES, cond_width, device=device), schedule.times)
    x = torch.zeros(batch, SEQ_FRAMES, MOTION_DIM, device=device)
    time_cond = schedule.times[0].expand(batch)
    inputs = (
        x,
        torch.zeros(batch, MOTION_DIM, device=device),
        *window,
        time_cond,
        schedule.coefficients[0],
        torch.zeros_like(x),
    )
    return contiguous(inputs)


ALIGNMENT = 16
"""Bytes a package's kernels assume each input starts on (AOTInductor copies any other input, warning, every call)."""


def contiguous(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The tensors in the dense row-major layout a package is exported with (its kernels assume the strides they saw),
    each starting on an ``ALIGNMENT``-byte boundary (a view into the middle of a buffer, such as one DDIM time, is
    copied)."""
    dense = (t.contiguous() for t in tensors)
    return tuple(t if t.data_ptr() % ALIGNMENT == 0 else t.clone() for t in dense)


def prepare_inputs(schedule: DDIMSchedule, batch: int, cond_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Example inputs of ``PrepareCall`` for ``batch`` windows."""
    return torch.zeros(batch, SEQ_FRAMES, cond_width, device=schedule.times.device), schedule.times


def render_inputs(
    batch: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Example inputs of ``RenderCall`` for ``batch`` frames."""
    kp = torch.zeros(batch, *KEYPOINTS, device=device, dtype=dtype)
    return torch.zeros(batch, *FEATURE_SHAPE, device=device, dtype=dtype), kp, kp.clone()

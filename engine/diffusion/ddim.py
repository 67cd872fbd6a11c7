"""DDIM sampling (η=1) of LMDM motion windows, seeded, batched, on the inputs' device.

``ddim_steps`` is the pure loop: fixed shapes, coefficients read from device tensors, no host
synchronisation, so it can be captured in a CUDA graph as it is. ``DDIMSampler`` owns the
random state: one noise tensor per step drawn once from its generator and reused for every
window (as the reference does), and a fresh x_T per window from the same generator.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.diffusion.schedule import DDIMSchedule, ddim_schedule
from engine.motion.vector import MOTION_DIM
from engine.timebase import DEFAULT_STEPS, SEQ_FRAMES

Denoiser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(x (B,L,265), cond_frame (B,265), cond (B,L,D), time_cond (B,) int64) -> (pred_noise, x_start), each (B,L,265)."""

DDIMStep = Callable[[torch.Tensor, torch.Tensor, object, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(x, cond_frame, cond, time_cond, coefficients (3,), noise (1|B,L,265)) -> the next x: one whole DDIM step.

``coefficients`` weigh (x0, ε̂, noise); the last step's (1, 0, 0) returns x0. A backend can fuse
the update into its denoiser's compiled step; ``denoiser_step`` composes it from a ``Denoiser``.
"""


def ddim_update(
    x_start: torch.Tensor, pred_noise: torch.Tensor, noise: torch.Tensor, coefficients: torch.Tensor
) -> torch.Tensor:
    """The DDIM update, the one place it is written: x0, ε̂ and the step's noise weighed by ``coefficients`` (3,)."""
    return x_start * coefficients[0] + pred_noise * coefficients[1] + noise * coefficients[2]


def denoiser_step(denoiser: Denoiser) -> DDIMStep:
    """The DDIM step of a plain denoiser: its (ε̂, x0) mixed with the noise by ``ddim_update``."""

    def step(x, cond_frame, cond, time_cond, coefficients, noise):
        pred_noise, x_start = denoiser(x, cond_frame, cond, time_cond)
        return ddim_update(x_start.to(x.dtype), pred_noise.to(x.dtype), noise, coefficients)

    return step


def ddim_loop(
    denoiser: Denoiser,
    x: torch.Tensor,
    cond_frame: torch.Tensor,
    cond: torch.Tensor,
    schedule: DDIMSchedule,
    step_noise: torch.Tensor,
) -> torch.Tensor:
    """Run the S DDIM steps of ``denoiser`` from x_T (B,L,265) and return x0 of the last; ``step_noise`` is (S−1, 1|B,
    L, 265)."""
    return ddim_steps(denoiser_step(denoiser), x, cond_frame, cond, schedule, step_noise)


def ddim_steps(
    step: DDIMStep,
    x: torch.Tensor,
    cond_frame: torch.Tensor,
    cond: object,
    schedule: DDIMSchedule,
    step_noise: torch.Tensor,
) -> torch.Tensor:
    """The S DDIM steps from x_T, each one ``step`` call (update included); the last step's weights (1, 0, 0) return
    x0."""
    batch = x.shape[0]
    for i in range(schedule.steps):
        noise = step_noise[min(i, schedule.steps - 2)] if schedule.steps > 1 else torch.zeros_like(x)
        x = step(x, cond_frame, cond, schedule.times[i].expand(batch), schedule.coefficients[i], noise)
    return x


class DDIMSampler:
    """Seeded DDIM sampler for (B,80,265) windows on one device."""

    def __init__(
        self,
        steps: int = DEFAULT_STEPS,
        seed: int = 0,
        device: torch.device | str = "cpu",
        seq_frames: int = SEQ_FRAMES,
    ) -> None:
        """Draws the S−1 per-step noise tensors (1,L,265) from a generator on ``device`` seeded with ``seed``."""
        self.device = torch.device(device)
        self.schedule = ddim_schedule(steps, self.device)
        self.shape = (seq_frames, MOTION_DIM)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.step_noise = torch.randn(
            (steps - 1, 1, *self.shape), generator=self.generator, device=self.device, dtype=torch.float32
        )

    @property
    def steps(self) -> int:
        """Number of denoiser calls per window."""
        return self.schedule.steps

    def initial_noise(self, batch: int = 1) -> torch.Tensor:
        """A fresh x_T (B,L,265) from the sampler's generator (each call advances it)."""
        return torch.randn((batch, *self.shape), generator=self.generator, device=self.device, dtype=torch.float32)

    def __call__(
        self, denoiser: Denoiser, cond_frame: torch.Tensor, cond: torch.Tensor, x: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sample windows (B,L,265) for cond_frame (B,265) and cond (B,L,D); x_T drawn here unless given."""
        batch = cond.shape[0]
        if cond.ndim != 3 or cond.shape[1] != self.shape[0]:
            raise ValueError(f"cond must be (B,{self.shape[0]},D), got shape {tuple(cond.shape)}")
        if cond_frame.shape != (batch, MOTION_DIM):
            raise ValueError(f"cond_frame must be ({batch},{MOTION_DIM}), got shape {tuple(cond_frame.shape)}")
        x = self.initial_noise(batch) if x is None else x
        if x.shape != (batch, *self.shape):
            raise ValueError(f"x must be ({batch},{self.shape[0]},{MOTION_DIM}), got shape {tuple(x.shape)}")
        return ddim_loop(denoiser, x, cond_frame, cond, self.schedule, self.step_noise)

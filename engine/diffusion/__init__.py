"""Motion diffusion: the DDIM schedule and sampler for the LMDM, and the streaming 80-frame windows."""

from engine.diffusion.ddim import DDIMSampler, Denoiser, ddim_loop
from engine.diffusion.schedule import (
    DDIMSchedule,
    alphas_cumprod,
    cosine_betas,
    ddim_schedule,
    ddim_time_pairs,
)
from engine.diffusion.windows import MotionWindows, WindowPlan, fuse_windows, smooth_frames

__all__ = [
    "DDIMSampler",
    "DDIMSchedule",
    "Denoiser",
    "MotionWindows",
    "WindowPlan",
    "alphas_cumprod",
    "cosine_betas",
    "ddim_loop",
    "ddim_schedule",
    "ddim_time_pairs",
    "fuse_windows",
    "smooth_frames",
]

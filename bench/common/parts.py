"""Timing the engine's parts, for the benchmarks that time them (bench.compute, bench.avatar_load, bench.reference,
bench.render_profile, bench.fp8_render): the runtime's window sampler graphed and seeded, avatar loads synchronized
on the device, the render's seeded inputs."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from avatars.cache import load_avatar
from engine.diffusion.ddim import DDIMSampler
from engine.diffusion.graphed import BucketedSampler
from engine.engine import Engine


def engine_window_sampler(engine: Engine, batches: tuple[int, ...] = (1, 4)):
    """``sample(cond_frame, cond, x=None)`` through the sampler the runtime uses (window conditions prepared once)."""
    return _seeded(engine.sampler(), DDIMSampler(engine.steps, seed=0, device=engine.device), batches)


def _seeded(sampler: BucketedSampler, ddim: DDIMSampler, batches: tuple[int, ...]):
    sampler.capture(batches)

    def sample(cond_frame: torch.Tensor, cond: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        batch = cond.shape[0]
        x = ddim.initial_noise(batch) if x is None else x
        return sampler(x, cond_frame, cond, ddim.step_noise.expand(-1, batch, -1, -1))

    return sample


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loads(path: str | Path, device: torch.device, runs: int, verify: bool) -> list[float]:
    """Wall milliseconds of ``runs`` loads (after one untimed warm-up), synchronized on the device."""
    load_avatar(path, device, verify=verify)
    sync(device)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        avatar = load_avatar(path, device, verify=verify)
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        del avatar
    return times


def render_inputs_with_motion(
    frames: int, device: torch.device, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first ``frames`` (<= 32) of the speed table's render inputs: random appearance features, source keypoints
    and driving keypoints a small motion away, as ``(feature_3d, kp_source, kp_driving)``; drawn from ``generator``
    (default: a new one seeded 0)."""
    g = generator or torch.Generator(device=device).manual_seed(0)
    feature = torch.randn(32, 32, 16, 64, 64, device=device, generator=g) * 0.5
    kp_s = (torch.rand(32, 21, 3, device=device, generator=g) - 0.5) * 0.6
    kp_d = kp_s + 0.02 * torch.randn(32, 21, 3, device=device, generator=g)
    return feature[:frames], kp_s[:frames], kp_d[:frames]

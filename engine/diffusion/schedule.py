"""Ditto's diffusion schedule: cosine betas (T=1000, s=0.008) and the DDIM (η=1) step coefficients for S steps."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TRAIN_STEPS = 1000
COSINE_OFFSET = 0.008
MAX_BETA = 0.999
ETA = 1.0


def cosine_betas(steps: int = TRAIN_STEPS, offset: float = COSINE_OFFSET) -> torch.Tensor:
    """β_i = clip(1 − ᾱ'(i+1)/ᾱ'(i), 0, 0.999) with ᾱ'(i) = cos²((i/T + s)/(1 + s)·π/2), computed in float64, returned
    float32 (T,)."""
    f = torch.cos((torch.arange(steps + 1, dtype=torch.float64) / steps + offset) / (1 + offset) * math.pi / 2) ** 2
    return (1 - f[1:] / f[:-1]).clamp(0.0, MAX_BETA).to(torch.float32)


def alphas_cumprod(betas: torch.Tensor | None = None) -> torch.Tensor:
    """ᾱ_t = Π_{i≤t} (1 − β_i), accumulated in float32 like the reference (T,)."""
    betas = cosine_betas() if betas is None else betas
    return torch.cumprod(1.0 - betas, dim=0)


def ddim_time_pairs(sampling_steps: int, train_steps: int = TRAIN_STEPS) -> list[tuple[int, int]]:
    """(t, t_next) per step: int(linspace(−1, T−1, S+1)) in float32, truncated, reversed; the last pair ends at −1."""
    if not 1 <= sampling_steps <= train_steps:
        raise ValueError(f"sampling steps must be in [1, {train_steps}], got {sampling_steps}")
    times = torch.linspace(-1, train_steps - 1, steps=sampling_steps + 1, dtype=torch.float32).int().tolist()
    times.reverse()
    return list(zip(times[:-1], times[1:]))


@dataclass(frozen=True)
class DDIMSchedule:
    """Per-step DDIM constants as tensors on one device: step i maps x_t to x_{t'} with t = times[i].

    For the S−1 steps with t' ≥ 0: x_{t'} = sqrt_alpha_next[i]·x0 + c[i]·ε̂ + sigma[i]·noise_i;
    the last step (t' = −1) returns x0.
    """

    time_pairs: tuple[tuple[int, int], ...]
    times: torch.Tensor
    sqrt_alpha_next: torch.Tensor
    c: torch.Tensor
    sigma: torch.Tensor
    coefficients: torch.Tensor
    """(S,3) weights of (x0, ε̂, noise) per step for ``ddim.DDIMStep``; the last step's (1, 0, 0) keeps x0."""

    @property
    def steps(self) -> int:
        """Number of denoiser calls S."""
        return len(self.time_pairs)

    def to(self, device: torch.device | str) -> DDIMSchedule:
        """The same schedule with its tensors on ``device``."""
        tensors = (self.times, self.sqrt_alpha_next, self.c, self.sigma, self.coefficients)
        return DDIMSchedule(self.time_pairs, *(t.to(device) for t in tensors))


def ddim_schedule(sampling_steps: int, device: torch.device | str | None = None) -> DDIMSchedule:
    """The DDIM schedule for S steps: σ = η·sqrt((1−ᾱ_t/ᾱ_{t'})(1−ᾱ_{t'})/(1−ᾱ_t)), c = sqrt(1−ᾱ_{t'}−σ²).

    The coefficients are evaluated in float64 from the float32 ᾱ (the reference's float32
    arithmetic loses ~1e-5 of c in the first step) and stored as float32.
    """
    pairs = ddim_time_pairs(sampling_steps)
    bar = alphas_cumprod().to(torch.float64)
    now = bar[[t for t, t_next in pairs if t_next >= 0]]
    nxt = bar[[t_next for _, t_next in pairs if t_next >= 0]]
    sigma = ETA * ((1 - now / nxt) * (1 - nxt) / (1 - now)).sqrt()
    c = (1 - nxt - sigma**2).clamp(min=0.0).sqrt()
    # Built here, not per loop: a CUDA graph capture cannot copy from the host.
    coefficients = torch.cat(
        (torch.stack((nxt.sqrt(), c, sigma), dim=-1), torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    )
    return DDIMSchedule(
        time_pairs=tuple(pairs),
        times=torch.tensor([t for t, _ in pairs], dtype=torch.int64, device=device),
        sqrt_alpha_next=nxt.sqrt().to(device=device, dtype=torch.float32),
        c=c.to(device=device, dtype=torch.float32),
        sigma=sigma.to(device=device, dtype=torch.float32),
        coefficients=coefficients.to(device=device, dtype=torch.float32),
    )

"""The DDIM sampler: the η=1 update, seeded noise reused across windows like the reference, batch independence."""

from __future__ import annotations

import math

import numpy as np
import torch

from engine.diffusion.ddim import DDIMSampler, ddim_loop, ddim_steps, denoiser_step
from engine.diffusion.schedule import alphas_cumprod

FRAMES, DIM, WIDTH = 80, 265, 12
BAR = alphas_cumprod()


def toy_denoiser(x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, time_cond: torch.Tensor):
    """An analytic stand-in for the LMDM: x0 depends on x, the conditions and t; ε̂ follows from x0 as in Ditto."""
    assert time_cond.shape == (x.shape[0],) and time_cond.dtype == torch.int64
    t = time_cond.to(torch.float32).reshape(-1, 1, 1)
    x_start = 0.5 * x + torch.tanh(cond.mean(-1, keepdim=True)) * 0.1 + cond_frame[:, None, :] * 0.01 + t / 1000
    bar = BAR[time_cond].reshape(-1, 1, 1)
    pred_noise = (x - bar.sqrt() * x_start) / (1 - bar).sqrt()
    return pred_noise, x_start


def reference_ddim(x, cond_frame, cond, step_noise, steps):
    """Plain transcription of the DDIM (η=1) loop in float64 with the time pairs written out for S=25."""
    bar = [float(v) for v in BAR]
    times = [999 - 40 * i for i in range(steps)]
    x = x.double().numpy()
    for i, t in enumerate(times):
        t_next = t - 40 if i < steps - 1 else -1
        pred_noise, x_start = (
            v.double().numpy()
            for v in toy_denoiser(torch.from_numpy(x).float(), cond_frame, cond, torch.full((x.shape[0],), t))
        )
        if t_next < 0:
            return x_start
        a, a_next = bar[t], bar[t_next]
        sigma = math.sqrt((1 - a / a_next) * (1 - a_next) / (1 - a))
        c = math.sqrt(1 - a_next - sigma**2)
        x = math.sqrt(a_next) * x_start + c * pred_noise + sigma * step_noise[i].double().numpy()
    raise AssertionError("no final step")


def _inputs(batch: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, DIM, generator=generator), torch.randn(batch, FRAMES, WIDTH, generator=generator)


def test_sampler_equals_a_plain_transcription_of_the_update() -> None:
    sampler = DDIMSampler(steps=25, seed=3)
    cond_frame, cond = _inputs(2)
    x = sampler.initial_noise(2)
    ours = sampler(toy_denoiser, cond_frame, cond, x=x.clone())
    expected = reference_ddim(x, cond_frame, cond, sampler.step_noise, 25)
    assert ours.shape == (2, FRAMES, DIM)
    np.testing.assert_allclose(ours.numpy(), expected, atol=2e-5)


def test_denoiser_sees_each_time_once_in_descending_order() -> None:
    seen: list[int] = []

    def recording(x, cond_frame, cond, time_cond):
        seen.append(int(time_cond[0]))
        return toy_denoiser(x, cond_frame, cond, time_cond)

    sampler = DDIMSampler(steps=50, seed=0)
    sampler(recording, *_inputs(1))
    assert seen == list(range(999, 18, -20))


def test_same_seed_same_windows_and_step_noise_is_reused() -> None:
    cond_frame, cond = _inputs(1)
    first, second = DDIMSampler(steps=5, seed=11), DDIMSampler(steps=5, seed=11)
    noise_before = first.step_noise.clone()
    windows_a = [first(toy_denoiser, cond_frame, cond) for _ in range(2)]
    windows_b = [second(toy_denoiser, cond_frame, cond) for _ in range(2)]
    for a, b in zip(windows_a, windows_b):
        assert torch.equal(a, b)
    assert torch.equal(first.step_noise, noise_before), "the per-step noise is drawn once and reused"
    assert not torch.equal(windows_a[0], windows_a[1]), "each window draws a fresh x_T"
    other = DDIMSampler(steps=5, seed=12)(toy_denoiser, cond_frame, cond)
    assert not torch.equal(other, windows_a[0])


def test_batch_elements_are_independent() -> None:
    sampler = DDIMSampler(steps=10, seed=5)
    cond_frame, cond = _inputs(2)
    x = sampler.initial_noise(2)
    together = sampler(toy_denoiser, cond_frame, cond, x=x)
    alone = sampler(toy_denoiser, cond_frame[1:], cond[1:], x=x[1:])
    torch.testing.assert_close(together[1:], alone, rtol=0, atol=1e-6)


def test_loop_accepts_per_element_noise() -> None:
    sampler = DDIMSampler(steps=4, seed=2)
    cond_frame, cond = _inputs(2)
    x = sampler.initial_noise(2)
    shared = ddim_loop(toy_denoiser, x, cond_frame, cond, sampler.schedule, sampler.step_noise)
    per_element = ddim_loop(
        toy_denoiser, x, cond_frame, cond, sampler.schedule, sampler.step_noise.expand(-1, 2, -1, -1).clone()
    )
    torch.testing.assert_close(shared, per_element, rtol=0, atol=0)


def test_whole_steps_of_a_denoiser_equal_the_loop() -> None:
    sampler = DDIMSampler(steps=6, seed=4)
    cond_frame, cond = _inputs(2)
    x = sampler.initial_noise(2)
    expected = ddim_loop(toy_denoiser, x, cond_frame, cond, sampler.schedule, sampler.step_noise)
    got = ddim_steps(denoiser_step(toy_denoiser), x, cond_frame, cond, sampler.schedule, sampler.step_noise)
    assert torch.equal(got, expected)


def test_a_single_step_schedule_returns_x0_without_noise() -> None:
    sampler = DDIMSampler(steps=1, seed=4)
    cond_frame, cond = _inputs(1)
    x = sampler.initial_noise(1)
    _, x_start = toy_denoiser(x, cond_frame, cond, sampler.schedule.times.expand(1))
    got = ddim_steps(denoiser_step(toy_denoiser), x, cond_frame, cond, sampler.schedule, sampler.step_noise)
    assert torch.equal(got, x_start)

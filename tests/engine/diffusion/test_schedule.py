"""The diffusion schedule equals Ditto's: cosine betas, ᾱ, the DDIM time pairs and η=1 coefficients."""

from __future__ import annotations

import math

import pytest
import torch

from engine.diffusion.schedule import alphas_cumprod, cosine_betas, ddim_schedule, ddim_time_pairs


def test_cosine_betas_match_the_reference_values() -> None:
    betas = cosine_betas()
    assert betas.dtype == torch.float32 and betas.shape == (1000,)
    assert betas[0].item() == pytest.approx(4.128e-5, rel=1e-3)
    assert betas[999].item() == pytest.approx(0.999)
    assert int((betas >= 0.999).sum()) == 1, "only the last beta is clipped"


def test_alphas_cumprod_match_the_reference_values() -> None:
    bar = alphas_cumprod()
    assert bar.dtype == torch.float32
    assert bar[0].item() == pytest.approx(0.999959, rel=1e-5)
    assert bar[979].item() == pytest.approx(9.712e-4, rel=1e-3)
    assert bar[999].item() == pytest.approx(2.43e-9, rel=1e-2)
    assert bool((bar[1:] < bar[:-1]).all()), "ᾱ decreases strictly"


@pytest.mark.parametrize(
    ("steps", "stride", "last"),
    [(50, 20, 19), (25, 40, 39), (10, 100, 99), (5, 200, 199)],
)
def test_time_pairs_step_down_from_999_and_end_at_minus_one(steps: int, stride: int, last: int) -> None:
    pairs = ddim_time_pairs(steps)
    times = [t for t, _ in pairs]
    assert len(pairs) == steps
    assert times == list(range(999, last - 1, -stride))
    assert pairs[-1] == (last, -1)
    assert all(t_next == t - stride for t, t_next in pairs[:-1])


def test_ddim_schedule_coefficients_for_50_steps_match_the_worked_examples() -> None:
    schedule = ddim_schedule(50)
    expected = {0: (0.03116, 0.00158, 0.99951), 1: (0.06230, 0.49854, 0.86462), 48: (0.99913, 0.02367, 0.03446)}
    for step, (sqrt_next, c, sigma) in expected.items():
        assert schedule.sqrt_alpha_next[step].item() == pytest.approx(sqrt_next, abs=1e-4)
        assert schedule.c[step].item() == pytest.approx(c, abs=1e-4)
        assert schedule.sigma[step].item() == pytest.approx(sigma, abs=1e-4)
    assert schedule.times[-1].item() == 19 and schedule.steps == 50


@pytest.mark.parametrize("steps", [25, 50])
def test_ddim_coefficients_follow_the_eta_one_formula(steps: int) -> None:
    schedule = ddim_schedule(steps)
    bar = [float(v) for v in alphas_cumprod()]
    pairs = ddim_time_pairs(steps)[:-1]
    assert schedule.sigma.shape == schedule.c.shape == schedule.sqrt_alpha_next.shape == (steps - 1,)
    for i, (t, t_next) in enumerate(pairs):
        a, a_next = bar[t], bar[t_next]
        sigma = math.sqrt((1 - a / a_next) * (1 - a_next) / (1 - a))
        assert schedule.sigma[i].item() == pytest.approx(sigma, abs=1e-6)
        assert schedule.c[i].item() == pytest.approx(math.sqrt(1 - a_next - sigma**2), abs=1e-6)
        assert schedule.sqrt_alpha_next[i].item() == pytest.approx(math.sqrt(a_next), abs=1e-6)


def test_schedule_moves_to_a_device_and_rejects_bad_step_counts() -> None:
    schedule = ddim_schedule(25).to("cpu")
    assert schedule.times.dtype == torch.int64 and schedule.times.device.type == "cpu"
    for bad in (0, 1001):
        with pytest.raises(ValueError, match="sampling steps"):
            ddim_schedule(bad)


def test_step_coefficients_weigh_x0_noise_prediction_and_noise_and_keep_x0_last() -> None:
    schedule = ddim_schedule(25)
    table = schedule.coefficients
    assert table.shape == (25, 3) and table.dtype == torch.float32
    assert torch.equal(table[:-1, 0], schedule.sqrt_alpha_next)
    assert torch.equal(table[:-1, 1], schedule.c) and torch.equal(table[:-1, 2], schedule.sigma)
    assert table[-1].tolist() == [1.0, 0.0, 0.0]

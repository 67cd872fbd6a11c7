"""The fused LMDM DDIM step: the same function as the plain LMDM (fp32, CPU), the checkpoint untouched.

Deterministic random weights in the official layout, so these check arithmetic, not motion quality.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from engine.diffusion.ddim import ddim_loop, ddim_steps, denoiser_step
from engine.diffusion.schedule import ddim_schedule
from engine.networks import OFFICIAL_FILENAMES, lmdm_fused, load_network
from engine.networks.lmdm import LMDM
from engine.networks.lmdm_blocks import RotaryEmbedding
from engine.networks.lmdm_fused import AlignedLinear, FusedLMDMStep, norm_rotary, norm_then_rotary, pair_swap

NAME = "lmdm"


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def net(checkpoint_dir) -> LMDM:
    return load_network("lmdm", checkpoint_dir("lmdm") / OFFICIAL_FILENAMES["lmdm"]).requires_grad_(False)


@pytest.fixture(scope="module")
def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return (
        torch.randn(2, 80, 265, generator=g),
        0.3 * torch.randn(2, 265, generator=g),
        torch.randn(2, 80, 1103, generator=g),
    )


@pytest.mark.parametrize("form", [norm_rotary, norm_then_rotary], ids=["one reduction", "eager"])
def test_norm_rotary_is_rotary_of_the_layer_norm_and_the_layer_norm(form) -> None:
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(512)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    torch.nn.init.normal_(norm.bias, 0.0, 0.1)
    rotary = RotaryEmbedding(512, max_positions=80)
    sign = torch.tensor([-1.0, 1.0]).repeat(256)
    x = 3 * torch.randn(2, 80, 512) + 1
    swapped = (pair_swap(norm.weight), pair_swap(norm.bias))
    with torch.no_grad():
        rotated, plain = form(x, norm, swapped, rotary.cos, rotary.sin * sign)
        expected = F.layer_norm(x, (512,), norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(plain, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rotated, rotary(expected), rtol=1e-5, atol=1e-5)


def test_an_aligned_linear_pads_with_zeros_to_multiples_of_8_and_keeps_the_function() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(530, 265)
    aligned = AlignedLinear(linear, torch.float32)
    weight, bias = aligned.weight, aligned.bias
    assert weight.shape == (272, 536) and bias.shape == (272,)
    assert not weight[265:].any() and not weight[:, 530:].any() and not bias[265:].any()
    x = torch.randn(4, 530)
    with torch.no_grad():
        torch.testing.assert_close(F.linear(F.pad(x, (0, 6)), weight, bias)[:, :265], linear(x))
        torch.testing.assert_close(aligned(x), linear(x))


def test_pair_swap_exchanges_neighbours() -> None:
    assert pair_swap(torch.arange(6.0)).tolist() == [1.0, 0.0, 3.0, 2.0, 5.0, 4.0]


def test_the_fused_denoiser_call_equals_the_plain_lmdm(net: LMDM, inputs) -> None:
    x, cond_frame, cond = inputs
    fused = FusedLMDMStep(net)
    with torch.no_grad():
        window = fused.prepare_window(cond, torch.tensor([999, 519, 39]))
        # Out of order: each call rewrites the time-token rows of the shared key/value buffer.
        for step in (39, 999, 519):
            times = torch.full((2,), step)
            expected = net(x, cond_frame, cond, times)
            got = fused.forward_prepared(x, cond_frame, window, times)
            for a, b in zip(got, expected, strict=True):
                assert relative(a, b) < 1e-5


@pytest.mark.parametrize(
    "merged_rows", [lmdm_fused.MERGED_PROJECTION_ROWS, 0], ids=["one q/k/v product", "two products"]
)
def test_a_fused_ddim_window_equals_the_plain_ddim_loop(net: LMDM, inputs, merged_rows: int, monkeypatch) -> None:
    monkeypatch.setattr(lmdm_fused, "MERGED_PROJECTION_ROWS", merged_rows)
    x, cond_frame, cond = inputs
    schedule = ddim_schedule(4)
    step_noise = torch.randn(3, 1, 80, 265, generator=torch.Generator().manual_seed(2))
    fused = FusedLMDMStep(net)
    with torch.no_grad():
        expected = ddim_loop(net, x, cond_frame, cond, schedule, step_noise)
        got = ddim_steps(
            fused.ddim_step, x, cond_frame, fused.prepare_window(cond, schedule.times), schedule, step_noise
        )
        plain = ddim_steps(denoiser_step(net), x, cond_frame, cond, schedule, step_noise)
    assert relative(got, expected) < 1e-5
    assert torch.equal(plain, expected), "the last step's (1, 0, 0) weights return x0 exactly"


def test_fp16_products_keep_a_window_as_close_to_fp32_as_tf32_would(net: LMDM, inputs) -> None:
    # fp16 operands round to the same 10-bit mantissa as TF32's; the residual stream, norms and update stay fp32.
    x, cond_frame, cond = inputs
    schedule = ddim_schedule(4)
    step_noise = torch.randn(3, 2, 80, 265, generator=torch.Generator().manual_seed(3))
    exact, half = FusedLMDMStep(net), FusedLMDMStep(net, torch.float16)
    with torch.no_grad():
        expected = ddim_steps(
            exact.ddim_step, x, cond_frame, exact.prepare_window(cond, schedule.times), schedule, step_noise
        )
        got = ddim_steps(half.ddim_step, x, cond_frame, half.prepare_window(cond, schedule.times), schedule, step_noise)
    assert got.dtype == torch.float32
    error = ((got - expected).norm() / expected.norm()).item()
    assert 1e-5 < error < 2e-3, f"fp16 products moved the window by {error:.1e} (relative)"
    assert half.layers[0].ff1_weight.dtype == torch.float16
    assert exact.layers[0].ff1_weight.data_ptr() == net.seqTransDecoder.stack[0].linear1.weight.data_ptr(), (
        "fp32: views, no copies"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "merged_rows", [lmdm_fused.MERGED_PROJECTION_ROWS, 0], ids=["one q/k/v product", "two products"]
)
def test_on_cuda_fp16_products_and_fp16_attention_stay_near_the_fp32_cpu_window(
    net: LMDM, inputs, merged_rows: int, monkeypatch
) -> None:
    monkeypatch.setattr(lmdm_fused, "MERGED_PROJECTION_ROWS", merged_rows)
    schedule = ddim_schedule(25)
    step_noise = torch.randn(24, 2, 80, 265, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = ddim_loop(net, *inputs, schedule, step_noise)
        gpu = FusedLMDMStep(copy.deepcopy(net).cuda(), torch.float16)
        cuda_schedule = ddim_schedule(25, torch.device("cuda"))
        x, cond_frame, cond = (t.cuda() for t in inputs)
        window = gpu.prepare_window(cond, cuda_schedule.times)
        got = ddim_steps(gpu.ddim_step, x, cond_frame, window, cuda_schedule, step_noise.cuda()).cpu()
    error = ((got - expected).norm() / expected.norm()).item()
    assert error < 3e-3, f"the CUDA window is {error:.1e} (relative) from the fp32 CPU window"


def test_the_checkpoint_layout_and_the_plain_module_are_untouched(net: LMDM, inputs) -> None:
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x, cond_frame, cond = inputs
    times = torch.full((2,), 519)
    with torch.no_grad():
        output = net(x, cond_frame, cond, times)
        FusedLMDMStep(net)
        again = net(x, cond_frame, cond, times)
    after = net.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert all(torch.equal(a, b) for a, b in zip(output, again, strict=True))

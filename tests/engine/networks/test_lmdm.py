"""LMDM denoiser: official checkpoint layout, guided-denoiser I/O, block math, schedule, reference parity.

The weights are deterministic random ones in the official layout (not the trained model), so
these tests check structure and arithmetic, not the quality of the motion.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.networks import CheckpointError, lmdm, load_network
from engine.networks.checkpoints import OFFICIAL_FILENAMES, wrap_state_dict
from engine.networks.lmdm_blocks import RotaryAttention, RotaryEmbedding, sinusoidal_embedding
from engine.timebase import SEQ_FRAMES
from tests.engine.networks.reference import reference_modules

B, L, M, D = 2, SEQ_FRAMES, lmdm.MOTION_DIM, lmdm.COND_DIM


def make_inputs(batch: int, cond_dim: int = D, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, L, M, generator=g)
    cond_frame = 0.5 * torch.randn(batch, M, generator=g)
    cond = torch.randn(batch, L, cond_dim, generator=g)
    time_cond = torch.tensor([999, 19, 500, 0][:batch], dtype=torch.int64)
    return x, cond_frame, cond, time_cond


@pytest.fixture(scope="module")
def net(checkpoint_dir) -> lmdm.LMDM:
    path = checkpoint_dir("lmdm") / OFFICIAL_FILENAMES["lmdm"]
    return load_network("lmdm", path)


@pytest.fixture(scope="module")
def outputs(net: lmdm.LMDM) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor]]:
    inputs = make_inputs(B)
    with torch.no_grad():
        return inputs, net(*inputs)


# --- checkpoint layout -------------------------------------------------------------------------


def test_state_dict_has_the_official_249_keys_and_parameter_count() -> None:
    state = lmdm.build().state_dict()
    assert len(state) == 249
    assert sum(1 for k in state if k.endswith("rotary.freqs")) == 11
    assert state["cond_projection.weight"].shape == (512, 1103)
    assert state["cond_encoder.0.self_attn.in_proj_weight"].shape == (1536, 512)
    assert state["seqTransDecoder.stack.7.film3.block.1.weight"].shape == (1024, 512)
    assert state["non_attn_cond_projection.3.weight"].shape == (512, 512)
    assert state["time_mlp.1.weight"].shape == (2048, 512)
    assert state["to_time_tokens.0.weight"].shape == (1024, 2048)
    assert state["null_cond_embed"].shape == (1, 80, 512)
    assert not any("alphas_cumprod" in k for k in state), "the schedule is recomputed, never stored"
    assert sum(p.numel() for p in lmdm.build().parameters()) == 47_788_297


def test_condition_width_is_taken_from_the_checkpoint(tmp_path: Path) -> None:
    source = lmdm.LMDM(cond_dim=1040)
    lmdm.randomize(source, torch.Generator().manual_seed(3))
    path = tmp_path / OFFICIAL_FILENAMES["lmdm"]
    torch.save(wrap_state_dict("lmdm", source.state_dict()), path)

    loaded = load_network("lmdm", path)

    assert loaded.cond_dim == 1040
    assert loaded.cond_projection.weight.shape == (512, 1040)
    with pytest.raises(ValueError, match=r"cond has shape \(1, 80, 1103\), expected \(1, 80, 1040\)"):
        loaded(*make_inputs(1, cond_dim=1103))


def test_a_file_without_the_condition_projection_is_rejected(tmp_path: Path) -> None:
    state = lmdm.build().state_dict()
    del state["cond_projection.weight"]
    path = tmp_path / OFFICIAL_FILENAMES["lmdm"]
    torch.save(wrap_state_dict("lmdm", state), path)
    with pytest.raises(CheckpointError, match="cond_projection.weight"):
        load_network("lmdm", path)


# --- denoiser I/O ------------------------------------------------------------------------------


def test_outputs_are_two_float32_motion_windows(outputs) -> None:
    _, (pred_noise, x_start) = outputs
    for y in (pred_noise, x_start):
        assert y.shape == (B, L, M)
        assert y.dtype == torch.float32
        assert torch.isfinite(y).all()


def test_random_weights_give_a_well_spread_x_start(outputs) -> None:
    _, (_, x_start) = outputs
    assert 0.3 < x_start.std().item() < 1.5
    assert x_start.std(dim=(0, 1)).min().item() > 0.05, "no motion channel is constant"


def test_pred_noise_is_the_noise_implied_by_x_start(net: lmdm.LMDM, outputs) -> None:
    (x, _, _, time_cond), (pred_noise, x_start) = outputs
    alpha_bar = net.alphas_cumprod[time_cond].view(-1, 1, 1)
    expected = (x - alpha_bar.sqrt() * x_start) / (1 - alpha_bar).sqrt()
    torch.testing.assert_close(pred_noise, expected, rtol=1e-4, atol=1e-3)


def test_a_batch_of_two_equals_two_batches_of_one(net: lmdm.LMDM, outputs) -> None:
    inputs, (pred_noise, x_start) = outputs
    with torch.no_grad():
        for i in range(B):
            one_noise, one_start = net(*(t[i : i + 1] for t in inputs))
            torch.testing.assert_close(one_start, x_start[i : i + 1], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(one_noise, pred_noise[i : i + 1], rtol=1e-5, atol=1e-4)


def test_batched_guidance_equals_two_separate_passes(net: lmdm.LMDM, outputs) -> None:
    inputs, (_, x_start) = outputs
    with torch.no_grad():
        conditioned = net.denoise(*inputs, keep_cond=True)
        unconditioned = net.denoise(*inputs, keep_cond=False)
    torch.testing.assert_close(x_start, 2 * conditioned - unconditioned, rtol=1e-5, atol=1e-5)
    assert (conditioned - unconditioned).abs().mean() > 0.1, "the condition changes the prediction"


def test_the_unconditional_pass_ignores_cond_but_not_cond_frame(net: lmdm.LMDM) -> None:
    x, cond_frame, cond, time_cond = make_inputs(1)
    with torch.no_grad():
        base = net.denoise(x, cond_frame, cond, time_cond, keep_cond=False)
        other_cond = net.denoise(x, cond_frame, torch.zeros_like(cond), time_cond, keep_cond=False)
        other_frame = net.denoise(x, cond_frame + 1.0, cond, time_cond, keep_cond=False)
    torch.testing.assert_close(other_cond, base, rtol=0, atol=0)
    assert (other_frame - base).abs().max() > 1e-2


def test_the_forward_is_deterministic(net: lmdm.LMDM, outputs) -> None:
    inputs, (pred_noise, x_start) = outputs
    with torch.no_grad():
        again_noise, again_start = net(*inputs)
    assert torch.equal(again_start, x_start) and torch.equal(again_noise, pred_noise)


@pytest.mark.slow
def test_randomize_draws_every_number_from_the_generator() -> None:
    states = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        module = lmdm.build()
        lmdm.randomize(module, torch.Generator().manual_seed(7))
        states.append(module.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_bad_inputs_are_rejected_with_the_expected_shape(net: lmdm.LMDM) -> None:
    x, cond_frame, cond, time_cond = make_inputs(1)
    with pytest.raises(ValueError, match=r"x has shape \(1, 60, 265\), expected \(1, 80, 265\)"):
        net(x[:, :60], cond_frame, cond, time_cond)
    with pytest.raises(ValueError, match="integer timesteps"):
        net(x, cond_frame, cond, time_cond.float())


@pytest.mark.slow
def test_fp16_x_start_stays_close_to_fp32(checkpoint_dir, outputs) -> None:
    """fp16 weights and activations; the guidance and noise prediction stay float32."""
    (x, cond_frame, cond, time_cond), (pred_noise, x_start) = outputs
    half = load_network("lmdm", checkpoint_dir("lmdm") / OFFICIAL_FILENAMES["lmdm"], dtype=torch.float16)
    assert half.alphas_cumprod.dtype == torch.float32, "the schedule must not be rounded to fp16"
    with torch.no_grad():
        noise16, start16 = half(x, cond_frame, cond, time_cond)
    relative = ((start16 - x_start).abs().max() / x_start.abs().max()).item()
    assert relative < 1e-2, f"fp16 x_start max relative error {relative:.2e}"
    # pred_noise inherits the x_start error times sqrt(ᾱ/(1-ᾱ)) (≈155 at t=0): the DDIM tail amplifies it.
    noise_error = (noise16 - pred_noise).abs().amax(dim=(1, 2))
    start_error = (start16 - x_start).abs().amax(dim=(1, 2))
    gain = (half.alphas_cumprod[time_cond] / (1 - half.alphas_cumprod[time_cond])).sqrt()
    assert torch.all(noise_error <= 1.01 * gain * start_error + 1e-3)


# --- block math --------------------------------------------------------------------------------


def test_rotary_rotates_each_interleaved_pair_like_a_complex_number() -> None:
    rotary = RotaryEmbedding(512, max_positions=82)
    x = torch.randn(2, 82, 512, dtype=torch.float64)
    pairs = torch.view_as_complex(x.view(2, 82, 256, 2).contiguous())
    angle = torch.arange(82, dtype=torch.float64)[:, None] / 10000.0 ** (
        torch.arange(256, dtype=torch.float64) * 2 / 512
    )
    expected = torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    torch.testing.assert_close(rotary(x.float()).double(), expected, rtol=1e-4, atol=1e-4)


def test_rotary_positions_restart_at_zero_for_a_shorter_sequence() -> None:
    rotary = RotaryEmbedding(512, max_positions=82)
    x = torch.randn(1, 82, 512)
    torch.testing.assert_close(rotary(x[:, :80]), rotary(x)[:, :80])
    torch.testing.assert_close(rotary(x)[:, 0], x[:, 0])


def test_sinusoidal_time_embedding_matches_its_formula() -> None:
    times = torch.tensor([0, 19, 999])
    embedding = sinusoidal_embedding(times, 512)
    for row, t in enumerate(times.tolist()):
        rates = [math.exp(-i * math.log(10000) / 255) for i in range(256)]
        expected = torch.tensor([math.sin(t * r) for r in rates] + [math.cos(t * r) for r in rates])
        torch.testing.assert_close(embedding[row], expected.float(), rtol=0, atol=2e-4)


def test_attention_splits_in_proj_into_q_k_v_like_torch_multihead_attention() -> None:
    torch.manual_seed(0)
    ours = RotaryAttention(512, 8)
    nn.init.normal_(ours.in_proj_weight, std=0.05)
    nn.init.normal_(ours.in_proj_bias, std=0.05)
    theirs = nn.MultiheadAttention(512, 8, batch_first=True).eval()
    theirs.load_state_dict(ours.state_dict())
    query, keys, values = torch.randn(2, 80, 512), torch.randn(2, 82, 512), torch.randn(2, 82, 512)
    with torch.no_grad():
        cross = ours.attend_cross(query, *ours.project_memory(keys, values))
        expected_cross = theirs(query, keys, values, need_weights=False)[0]
        own = ours.attend_self(query, values[:, :80])
        expected_self = theirs(query, query, values[:, :80], need_weights=False)[0]
    torch.testing.assert_close(cross, expected_cross, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(own, expected_self, rtol=1e-5, atol=1e-5)


def test_cosine_schedule_values() -> None:
    alpha_bar = lmdm.LMDM().alphas_cumprod
    assert alpha_bar.dtype == torch.float32 and alpha_bar.shape == (1000,)
    assert alpha_bar[0].item() == pytest.approx(0.999959, abs=1e-6)
    assert alpha_bar[979].item() == pytest.approx(9.712e-4, rel=1e-3)
    assert alpha_bar[999].item() == pytest.approx(2.43e-9, rel=1e-2)
    assert torch.all(alpha_bar[1:] < alpha_bar[:-1])


def test_schedule_agrees_with_the_sampler_schedule() -> None:
    from engine.diffusion.schedule import alphas_cumprod

    assert torch.equal(lmdm.LMDM().alphas_cumprod, alphas_cumprod())


# --- reference parity --------------------------------------------------------------------------


@pytest.mark.slow
def test_matches_the_reference_lmdm(net: lmdm.LMDM, outputs) -> None:
    modules = reference_modules()
    reference = modules.LMDM(motion_feat_dim=265, audio_feat_dim=1103, seq_frames=80, device="cpu")
    reference.model.load_state_dict(net.state_dict(), strict=True)
    reference.eval()
    inputs, ours = outputs
    with torch.no_grad():
        theirs = reference(*inputs)
    for name, a, b in zip(("pred_noise", "x_start"), ours, theirs, strict=True):
        relative = ((a - b).abs().max() / b.abs().max()).item()
        assert relative < 1e-4, f"{name}: max relative difference {relative:.2e}"


def test_a_prepared_window_gives_the_same_denoiser_calls(checkpoint_dir) -> None:
    net = load_network("lmdm", checkpoint_dir("lmdm") / "lmdm_v0.4_hubert.pth")
    g = torch.Generator().manual_seed(7)
    x, cond_frame = torch.randn(2, 80, 265, generator=g), torch.randn(2, 265, generator=g) * 0.3
    cond = torch.randn(2, 80, 1103, generator=g)
    with torch.no_grad():
        prepared = net.prepare_window(cond, torch.tensor([999, 519, 39]))
        for step in (999, 39):
            times = torch.full((2,), step, dtype=torch.int64)
            expected = net(x, cond_frame, cond, times)
            got = net.forward_prepared(x, cond_frame, prepared, times)
            for a, b in zip(got, expected):
                # Same arithmetic, summed in another order (per-step tables are batched over the steps).
                assert ((a - b).abs().max() / b.abs().max()).item() < 1e-5

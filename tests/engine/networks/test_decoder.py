"""Specification of the SPADE decoder: official layout, folded spectral norm, block math, batching, fp16, parity.

Weights are deterministic random ones in the official layout: the decoded images are well
spread noise, not faces. A full 512x512 decode takes seconds on a CPU, so only the
module-scoped ``decoded`` fixture and the reference parity test decode at full size; the
other properties are checked on a 16x16 feature (the decoder is fully convolutional).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.networks import OFFICIAL_FILENAMES, load_network
from engine.networks import decoder as dec
from engine.networks.checkpoints import load_strict, read_checkpoint
from tests.engine.networks.reference import max_rel_err, reference_modules

NAME = "decoder"
SPECTRAL_CONVS = [f"G_middle_{i}.conv_{j}" for i in range(6) for j in (0, 1)] + [
    f"up_{i}.conv_{j}" for i in (0, 1) for j in ("0", "1", "s")
]


@pytest.fixture(scope="module")
def checkpoint(checkpoint_dir: Callable[..., Path]) -> Path:
    return checkpoint_dir(NAME) / OFFICIAL_FILENAMES[NAME]


@pytest.fixture(scope="module")
def state(checkpoint: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(NAME, checkpoint)


@pytest.fixture(scope="module")
def network(checkpoint: Path) -> nn.Module:
    return load_network(NAME, checkpoint)


@pytest.fixture(scope="module")
def feature() -> torch.Tensor:
    return torch.randn(1, 256, 64, 64, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def decoded(network: nn.Module, feature: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return network(feature)


@pytest.fixture(scope="module")
def small_feature() -> torch.Tensor:
    return torch.randn(2, 256, 16, 16, generator=torch.Generator().manual_seed(4))


@pytest.fixture(scope="module")
def small_decoded(network: nn.Module, small_feature: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return network(small_feature)


def test_state_dict_has_the_official_keys_and_shapes() -> None:
    state = dec.build().state_dict()
    assert len(state) == 182
    assert state["fc.weight"].shape == (512, 256, 3, 3)
    assert state["G_middle_0.conv_0.weight_orig"].shape == (512, 512, 3, 3)
    assert state["G_middle_0.conv_0.weight_u"].shape == (512,)
    assert state["G_middle_0.conv_0.weight_v"].shape == (4608,)
    assert state["up_0.conv_s.weight_orig"].shape == (256, 512, 1, 1)
    assert "up_0.conv_s.bias" not in state
    assert state["up_1.norm_s.mlp_shared.0.weight"].shape == (128, 256, 3, 3)
    assert state["up_1.norm_1.mlp_gamma.weight"].shape == (64, 128, 3, 3)
    assert state["conv_img.0.weight"].shape == (12, 64, 3, 3)
    assert not any(k.endswith(".weight") and k.rsplit(".", 1)[0] in SPECTRAL_CONVS for k in state)
    assert sum(p.numel() for p in dec.build().parameters()) == 55_365_388


def test_random_spectral_vectors_are_consistent_with_their_weights(state: dict[str, torch.Tensor]) -> None:
    """v is a unit vector, u = normalize(W v), and sigma approximates the largest singular value."""
    for name in SPECTRAL_CONVS:
        w = state[f"{name}.weight_orig"].double().flatten(1)
        u, v = state[f"{name}.weight_u"].double(), state[f"{name}.weight_v"].double()
        assert abs(v.norm().item() - 1) < 1e-6
        torch.testing.assert_close(u, F.normalize(w @ v, dim=0), rtol=1e-5, atol=1e-6)
    for name in ("up_0.conv_s", "up_1.conv_0"):
        w = state[f"{name}.weight_orig"].double().flatten(1)
        sigma = state[f"{name}.weight_u"].double() @ w @ state[f"{name}.weight_v"].double()
        assert 0.95 < (sigma / torch.linalg.matrix_norm(w, ord=2)).item() <= 1 + 1e-9


def test_folded_weight_is_weight_orig_over_sigma(state: dict[str, torch.Tensor]) -> None:
    conv = dec.SpectralNormConv2d(512, 512, 3)
    conv.load_state_dict({k.split(".", 2)[2]: v for k, v in state.items() if k.startswith("G_middle_3.conv_1.")})
    w, u, v = (state[f"G_middle_3.conv_1.{s}"].double() for s in ("weight_orig", "weight_u", "weight_v"))
    sigma = torch.einsum("o,oi,i->", u, w.flatten(1), v)
    folded = conv.fold()
    torch.testing.assert_close(folded.weight.double(), w / sigma, rtol=1e-6, atol=0)
    assert torch.equal(folded.bias, state["G_middle_3.conv_1.bias"])


def test_folded_weight_equals_torch_spectral_norm_in_eval(state: dict[str, torch.Tensor]) -> None:
    prefix = "up_0.conv_s."
    torch_conv = torch.nn.utils.spectral_norm(nn.Conv2d(512, 256, 1, bias=False))
    torch_conv.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, strict=True)
    torch_conv.eval()
    with torch.no_grad():
        torch_conv(torch.zeros(1, 512, 1, 1))
    conv = dec.SpectralNormConv2d(512, 256, 1, bias=False)
    conv.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, strict=True)
    folded = conv.fold()
    assert folded.bias is None
    torch.testing.assert_close(folded.weight, torch_conv.weight, rtol=1e-7, atol=0)


def test_loading_folds_every_spectral_norm_into_a_plain_conv(network: nn.Module) -> None:
    assert not any(isinstance(m, dec.SpectralNormConv2d) for m in network.modules())
    keys = network.state_dict()
    assert not any(k.endswith(("weight_orig", "weight_u", "weight_v")) for k in keys)
    assert all(f"{name}.weight" in keys for name in SPECTRAL_CONVS)


@pytest.mark.slow
def test_unfolded_and_folded_decoders_agree(state: dict[str, torch.Tensor], small_feature, small_decoded) -> None:
    unfolded = dec.build()
    load_strict(unfolded, state, NAME, "<memory>")
    unfolded.eval()
    with torch.no_grad():
        out = unfolded(small_feature[:1])
    torch.testing.assert_close(out, small_decoded[:1], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_decodes_to_512_rgb_in_unit_range(decoded: torch.Tensor) -> None:
    assert decoded.shape == (1, 3, 512, 512)
    assert decoded.dtype == torch.float32
    assert torch.isfinite(decoded).all()
    assert decoded.min() >= 0 and decoded.max() <= 1


@pytest.mark.slow
def test_random_weights_give_a_spread_unsaturated_image(decoded: torch.Tensor) -> None:
    saturated = ((decoded < 0.02) | (decoded > 0.98)).float().mean().item()
    print(f"decoder random output: std {decoded.std().item():.4f}, saturated fraction {saturated:.2e}")
    assert 0.1 < decoded.std().item() < 0.3
    assert saturated < 0.01
    assert all(0.1 < decoded[0, c].std().item() for c in range(3))


@pytest.mark.slow
def test_batch_of_two_equals_two_batches_of_one(network: nn.Module, small_feature, small_decoded) -> None:
    with torch.no_grad():
        singles = torch.cat([network(small_feature[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(singles, small_decoded, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_decoding_is_deterministic(network: nn.Module, small_feature, small_decoded) -> None:
    with torch.no_grad():
        again = network(small_feature)
    assert torch.equal(again, small_decoded)


@pytest.mark.slow
def test_randomize_is_deterministic_per_generator() -> None:
    first, second = dec.build(), dec.build()
    for net in (first, second):
        dec.randomize(net, torch.Generator().manual_seed(9))
    a, b = first.state_dict(), second.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_fp16_decode_agrees_with_fp32(network: nn.Module, small_feature, small_decoded) -> None:
    """Half precision end to end, InstanceNorm included (channels-last: CPU half convolutions are slow otherwise)."""
    half = copy.deepcopy(network).to(dtype=torch.float16, memory_format=torch.channels_last)
    with torch.no_grad():
        out = half(small_feature[:1].half().contiguous(memory_format=torch.channels_last))
    assert out.dtype == torch.float16
    error = (out.float() - small_decoded[:1]).abs().max().item()
    print(f"decoder fp16 vs fp32 (16x16 feature): max abs error {error:.2e}")
    assert error < 1e-2


def test_spade_normalises_per_instance_and_modulates_by_the_resized_segmap() -> None:
    """out = instance_norm(x) * (1 + gamma) + beta, gamma/beta from convs of the nearest-upsampled segmap."""
    spade = dec.SPADE(norm_channels=4, label_channels=3)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in spade.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    x = 3 + 2 * torch.randn(2, 4, 8, 8, generator=generator)
    seg = torch.randn(2, 3, 4, 4, generator=generator)
    mean = x.mean(dim=(2, 3), keepdim=True)
    var = ((x - mean) ** 2).mean(dim=(2, 3), keepdim=True)
    normalized = (x - mean) / torch.sqrt(var + 1e-5)
    seg_up = seg.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    shared, gamma_conv, beta_conv = spade.mlp_shared[0], spade.mlp_gamma, spade.mlp_beta
    hidden = torch.relu(F.conv2d(seg_up, shared.weight, shared.bias, padding=1))
    gamma = F.conv2d(hidden, gamma_conv.weight, gamma_conv.bias, padding=1)
    beta = F.conv2d(hidden, beta_conv.weight, beta_conv.bias, padding=1)
    with torch.no_grad():
        out = spade(x, seg)
    torch.testing.assert_close(out, normalized * (1 + gamma) + beta, rtol=1e-5, atol=1e-5)


def _randomized_block(fin: int, fout: int, seed: int) -> dec.SPADEResnetBlock:
    block = dec.SPADEResnetBlock(fin, fout, label_channels=3)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in block.parameters():
            tensor.copy_(0.3 * torch.randn(tensor.shape, generator=generator))
        for conv in (m for m in block.modules() if isinstance(m, dec.SpectralNormConv2d)):
            conv.weight_v.copy_(F.normalize(torch.randn(conv.weight_v.shape, generator=generator), dim=0))
            conv.weight_u.copy_(F.normalize(conv.weight_orig.flatten(1) @ conv.weight_v, dim=0))
    return block


def _sn_conv(x: torch.Tensor, block: nn.Module, name: str) -> torch.Tensor:
    conv = getattr(block, name)
    w = conv.weight_orig
    sigma = (conv.weight_u[:, None] * w.flatten(1) * conv.weight_v[None, :]).sum()
    return F.conv2d(x, w / sigma, conv.bias, padding=w.shape[-1] // 2)


def test_resnet_block_with_learned_shortcut() -> None:
    """out = conv_s(norm_s(x)) + conv_1(lrelu(norm_1(conv_0(lrelu(norm_0(x)))))), convs spectrally normalised."""
    block = _randomized_block(6, 4, seed=2)
    generator = torch.Generator().manual_seed(3)
    x, seg = torch.randn(1, 6, 8, 8, generator=generator), torch.randn(1, 3, 8, 8, generator=generator)
    with torch.no_grad():
        dx = _sn_conv(F.leaky_relu(block.norm_0(x, seg), 0.2), block, "conv_0")
        dx = _sn_conv(F.leaky_relu(block.norm_1(dx, seg), 0.2), block, "conv_1")
        expected = _sn_conv(block.norm_s(x, seg), block, "conv_s") + dx
        assert block.conv_0.weight_orig.shape[0] == 4
        torch.testing.assert_close(block(x, seg), expected, rtol=1e-5, atol=1e-5)


def test_resnet_block_of_equal_width_has_an_identity_shortcut() -> None:
    block = _randomized_block(4, 4, seed=4)
    assert not any(".conv_s." in k or "norm_s." in k for k in block.state_dict())
    generator = torch.Generator().manual_seed(5)
    x, seg = torch.randn(1, 4, 8, 8, generator=generator), torch.randn(1, 3, 8, 8, generator=generator)
    with torch.no_grad():
        dx = _sn_conv(F.leaky_relu(block.norm_0(x, seg), 0.2), block, "conv_0")
        dx = _sn_conv(F.leaky_relu(block.norm_1(dx, seg), 0.2), block, "conv_1")
        torch.testing.assert_close(block(x, seg), x + dx, rtol=1e-5, atol=1e-5)


def test_image_head_pixel_shuffles_channel_4c_plus_2i_plus_j_to_colour_c_offset_i_j(network: nn.Module) -> None:
    x = torch.randn(1, 64, 4, 5, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = network.conv_img[0](x)
        after = network.conv_img(x)
    assert after.shape == (1, 3, 8, 10)
    for c in range(3):
        for i in range(2):
            for j in range(2):
                assert torch.equal(after[0, c, i::2, j::2], before[0, 4 * c + 2 * i + j])


def test_wrong_feature_shape_is_a_clear_error(network: nn.Module) -> None:
    with pytest.raises(ValueError, match=r"\(B,256,64,64\)"):
        network(torch.zeros(1, 3, 64, 64))


@pytest.mark.slow
def test_matches_the_reference_decoder(state: dict[str, torch.Tensor], feature, decoded) -> None:
    reference = reference_modules().SPADEDecoder()
    reference.load_state_dict(state, strict=True)
    reference.eval()
    with torch.no_grad():
        expected = reference(feature)
    error = max_rel_err(decoded, expected)
    print(f"decoder parity: max|ours-ref|/max|ref| = {error:.3e}")
    assert error < 1e-4

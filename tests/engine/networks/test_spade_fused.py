"""The decoder's fused SPADEs compute the same function as the plain modules, in fp32 and in fp16.

Weights are the project's deterministic random ones (``decoder.randomize``), not official ones.
The decoder is fully convolutional and nothing in the rewrite depends on the frame size, so a
16x16 feature (upsampled to 32 and 64 inside) stands in for the 64x64 one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.networks import OFFICIAL_FILENAMES, load_network
from engine.networks import decoder as dec
from engine.networks.spade_fused import FusedModulation, SharedHidden, UpsampledConv, phase_taps


def _random_decoder() -> dec.SPADEDecoder:
    net = dec.build()
    dec.randomize(net, torch.Generator().manual_seed(0))
    dec.finalize(net)
    return net.eval()


@pytest.fixture(scope="module")
def plain() -> dec.SPADEDecoder:
    return _random_decoder()


@pytest.fixture(scope="module")
def fused(plain: dec.SPADEDecoder) -> dec.SPADEDecoder:
    net = copy.deepcopy(plain)
    net.use_fused_spade()
    return net


def _decode_with_activation(net: dec.SPADEDecoder, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The RGB output and the last block's output (before the head's sigmoid flattens differences)."""
    seen = []
    hook = net.up_1.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        rgb = net(feature)
    hook.remove()
    return rgb, seen[0]


def test_phase_taps_sum_the_kernel_rows_that_land_on_one_source_row() -> None:
    """x4: phase 0 reads rows i-1 (tap -1) and i (taps 0, +1); phases 1, 2 only row i; phase 3 rows i and i+1."""
    taps, first = phase_taps(4, 0)
    assert first == -1 and taps.tolist() == [[1, 0, 0], [0, 1, 1]]
    for inner in (1, 2):
        taps, first = phase_taps(4, inner)
        assert first == 0 and taps.tolist() == [[1, 1, 1]]
    taps, first = phase_taps(4, 3)
    assert first == 0 and taps.tolist() == [[1, 1, 0], [0, 0, 1]]
    taps, first = phase_taps(1, 0)
    assert first == -1 and taps.tolist() == torch.eye(3).tolist()


@pytest.mark.parametrize("scale", [1, 2, 3, 4])
def test_an_upsampled_conv_equals_a_conv_over_the_nearest_upsampling(scale: int) -> None:
    generator = torch.Generator().manual_seed(scale)
    weight, bias = torch.randn(6, 5, 3, 3, generator=generator), torch.randn(6, generator=generator)
    x = torch.randn(2, 5, 7, 9, generator=generator)
    expected = F.conv2d(F.interpolate(x, scale_factor=scale, mode="nearest"), weight, bias, padding=1)
    torch.testing.assert_close(UpsampledConv(weight, bias, scale)(x), expected, rtol=1e-5, atol=1e-5)


def test_phases_sharing_a_kernel_size_share_one_convolution() -> None:
    """x2: one 2x2 convolution for all 4 phases (16 of 36 taps); x4: 2x2, 2x1, 1x2, 1x1, 4 phases each (36 of 144)."""
    weight, bias = torch.zeros(3, 2, 3, 3), torch.zeros(3)
    x2, x4 = (UpsampledConv(weight, bias, scale) for scale in (2, 4))
    assert [k.shape for k in _kernels(x2)] == [(4 * 3, 2, 2, 2)]
    assert [k.shape for k in _kernels(x4)] == [(4 * 3, 2, 2, 2), (4 * 3, 2, 2, 1), (4 * 3, 2, 1, 2), (4 * 3, 2, 1, 1)]
    assert sum(k[0, 0].numel() * 4 for k in _kernels(x4)) == 36


def _kernels(conv: UpsampledConv) -> list[torch.Tensor]:
    return [getattr(conv, f"weight_{i}") for i in range(len(conv.paddings))]


def test_a_fused_modulation_equals_the_spade_it_replaces() -> None:
    """Two SPADEs over one x2-upsampled segmap: one shared hidden map, gamma and beta from one convolution each."""
    generator = torch.Generator().manual_seed(7)
    spades = [dec.SPADE(norm_channels=4, label_channels=3), dec.SPADE(norm_channels=4, label_channels=3)]
    with torch.no_grad():
        for p in (p for spade in spades for p in spade.parameters()):
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    x = 3 + 2 * torch.randn(2, 4, 8, 10, generator=generator)
    segmap = torch.randn(2, 3, 4, 5, generator=generator)
    with torch.no_grad():
        (hidden,) = SharedHidden([(2, spades)])(segmap)
        assert hidden.shape == (2, 2 * dec.SPADE_HIDDEN, 8, 10)
        for index, spade in enumerate(spades):
            fused = FusedModulation(spade, index * dec.SPADE_HIDDEN)
            expected = spade(x, segmap)
            assert (fused(x, hidden) - expected).abs().max() / expected.abs().max() < 1e-5


def test_the_fused_decoder_decodes_as_before(plain: dec.SPADEDecoder, fused: dec.SPADEDecoder) -> None:
    feature = torch.randn(2, 256, 16, 16, generator=torch.Generator().manual_seed(1))
    rgb, activation = _decode_with_activation(plain, feature)
    fused_rgb, fused_activation = _decode_with_activation(fused, feature)
    error = (fused_activation - activation).abs().max().item() / activation.abs().max().item()
    print(
        f"fused vs plain decoder, fp32, 16x16: last block max rel err {error:.1e}, rgb "
        f"{(fused_rgb - rgb).abs().max().item():.1e}"
    )
    assert error < 1e-5
    assert (fused_rgb - rgb).abs().max().item() < 1e-5
    assert rgb.std().item() > 0.05


@pytest.mark.slow
def test_the_fused_decoder_in_fp16_is_as_close_to_fp32_as_the_plain_one(
    plain: dec.SPADEDecoder, fused: dec.SPADEDecoder
) -> None:
    """Half weights and activations end to end (channels-last, as the backend runs them); fused buffers follow .to()."""
    feature = torch.randn(1, 256, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = plain(feature)
        errors = {}
        for name, net in (("plain", plain), ("fused", fused)):
            half = copy.deepcopy(net).to(dtype=torch.float16, memory_format=torch.channels_last)
            out = half(feature.half().contiguous(memory_format=torch.channels_last))
            assert out.dtype == torch.float16
            errors[name] = (out.float() - expected).abs().max().item()
    print(f"decoder fp16 vs plain fp32 (8x8): max abs error plain {errors['plain']:.2e}, fused {errors['fused']:.2e}")
    assert errors["fused"] < 1e-2
    assert errors["fused"] < 2 * errors["plain"]


def test_fusing_replaces_the_spades_but_not_the_checkpoint_layout(
    plain: dec.SPADEDecoder, fused: dec.SPADEDecoder, checkpoint_dir: Callable[..., Path]
) -> None:
    """Fused buffers are not saved; loading a checkpoint still gives the plain SPADEs (CPU path, ONNX export)."""
    assert not any(isinstance(m, dec.SPADE) for m in fused.modules())
    assert sum(isinstance(m, FusedModulation) for m in fused.modules()) == 18
    assert set(fused.state_dict()) == {k for k in plain.state_dict() if ".norm_" not in k}
    loaded = load_network("decoder", checkpoint_dir("decoder") / OFFICIAL_FILENAMES["decoder"])
    assert loaded.shared_hidden is None
    assert sum(isinstance(m, dec.SPADE) for m in loaded.modules()) == 18
    with pytest.raises(RuntimeError, match="already fused"):
        copy.deepcopy(fused).use_fused_spade()


def test_fused_weights_are_channels_last_for_cudnn(fused: dec.SPADEDecoder) -> None:
    buffers = [
        b
        for m in fused.modules()
        if isinstance(m, (FusedModulation, UpsampledConv))
        for b in m.buffers()
        if b.dim() == 4
    ]
    assert len(buffers) == 18 + 1 + 1 + 4
    assert all(b.is_contiguous(memory_format=torch.channels_last) for b in buffers)

"""The decoder's fused SPADEs and composed shortcuts compute the same function as the plain modules, in fp32 and fp16.

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
from torch.utils.flop_counter import FlopCounterMode

from engine.networks import OFFICIAL_FILENAMES, load_network
from engine.networks import decoder as dec
from engine.networks.spade_fused import ComposedShortcut, FusedModulation, SharedHidden, UpsampledConv, phase_taps


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


@pytest.fixture(scope="module")
def composed(fused: dec.SPADEDecoder) -> dec.SPADEDecoder:
    net = copy.deepcopy(fused)
    net.use_composed_shortcuts()
    return net


@pytest.fixture(scope="module")
def decodes(
    plain: dec.SPADEDecoder, fused: dec.SPADEDecoder, composed: dec.SPADEDecoder
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each variant's RGB output and last block's output for one 16x16 feature, decoded once for the tests below."""
    feature = torch.randn(2, 256, 16, 16, generator=torch.Generator().manual_seed(1))
    variants = {"plain": plain, "fused": fused, "composed": composed}
    return {name: _decode_with_activation(net, feature) for name, net in variants.items()}


def _psnr(image: torch.Tensor, reference: torch.Tensor) -> float:
    """PSNR in dB of an image in [0, 1] against a reference one."""
    return 10 * torch.log10(1 / (image.double() - reference.double()).pow(2).mean()).item()


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


def test_the_fused_decoder_decodes_as_before(decodes: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    (rgb, activation), (fused_rgb, fused_activation) = decodes["plain"], decodes["fused"]
    error = (fused_activation - activation).abs().max().item() / activation.abs().max().item()
    print(
        f"fused vs plain decoder, fp32, 16x16: last block max rel err {error:.1e}, rgb "
        f"{(fused_rgb - rgb).abs().max().item():.1e}"
    )
    assert error < 1e-5
    assert (fused_rgb - rgb).abs().max().item() < 1e-5
    assert rgb.std().item() > 0.05


@pytest.mark.slow
def test_the_fused_and_composed_decoders_in_fp16_are_as_close_to_fp32_as_the_plain_one(
    plain: dec.SPADEDecoder, fused: dec.SPADEDecoder
) -> None:
    """Half weights and activations end to end (channels-last, as the backend runs them); fused buffers follow .to().
    The shortcuts are composed from the half weights, as the backend does (load in fp16, fuse, compose)."""
    feature = torch.randn(1, 256, 8, 8, generator=torch.Generator().manual_seed(3))
    composed = copy.deepcopy(fused).half()
    composed.use_composed_shortcuts()
    with torch.no_grad():
        expected = plain(feature)
        outs = {}
        for name, net in (("plain", plain), ("fused", fused), ("composed", composed)):
            half = copy.deepcopy(net).to(dtype=torch.float16, memory_format=torch.channels_last)
            out = half(feature.half().contiguous(memory_format=torch.channels_last))
            assert out.dtype == torch.float16
            outs[name] = out.float()
    errors = {name: (out - expected).abs().max().item() for name, out in outs.items()}
    composed_vs_fused = _psnr(outs["composed"], outs["fused"])
    print(
        f"decoder fp16 vs plain fp32 (8x8): max abs error plain {errors['plain']:.2e}, fused {errors['fused']:.2e}, "
        f"composed {errors['composed']:.2e}; composed vs fused, both fp16: PSNR {composed_vs_fused:.1f} dB"
    )
    assert errors["fused"] < 1e-2
    assert errors["fused"] < 2 * errors["plain"]
    assert errors["composed"] < 2 * errors["plain"]
    assert composed_vs_fused >= 50


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


def test_a_composed_shortcut_equals_conv_s_of_the_fused_spade() -> None:
    """conv_s(n·(1+gamma) + beta) as conv_s(n·(1+gamma)) + (conv_s∘beta)(hidden): beta's convolution has conv_s's 4
    outputs instead of the SPADE's 6."""
    generator = torch.Generator().manual_seed(11)
    spade = dec.SPADE(norm_channels=6, label_channels=3)
    conv_s = torch.nn.Conv2d(6, 4, 1, bias=False)
    with torch.no_grad():
        for p in (*spade.parameters(), conv_s.weight):
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    x = 3 + 2 * torch.randn(2, 6, 8, 10, generator=generator)
    hidden = torch.randn(2, 2 * dec.SPADE_HIDDEN, 8, 10, generator=generator).relu()
    fused = FusedModulation(spade, dec.SPADE_HIDDEN)
    shortcut = ComposedShortcut(fused, conv_s)
    assert fused.weight.shape == (6 + 6, dec.SPADE_HIDDEN, 3, 3)
    assert shortcut.weight.shape == (6 + 4, dec.SPADE_HIDDEN, 3, 3)
    with torch.no_grad():
        expected = conv_s(fused(x, hidden))
        assert (shortcut(x, hidden) - expected).abs().max() / expected.abs().max() < 1e-5


def test_composing_narrows_the_shortcut_beta_of_both_up_blocks(
    fused: dec.SPADEDecoder, composed: dec.SPADEDecoder
) -> None:
    """Only up_0 (512 to 256) and up_1 (256 to 64) have learned shortcuts; both narrow, so both are cut."""
    cut = [name for name, block in composed.named_children() if getattr(block, "composed_shortcut", None) is not None]
    assert cut == ["up_0", "up_1"]
    for name, channels, outputs in (("up_0", 512, 256), ("up_1", 256, 64)):
        before, after = getattr(fused, name), getattr(composed, name)
        assert before.norm_s.weight.shape == (2 * channels, dec.SPADE_HIDDEN, 3, 3)
        assert after.composed_shortcut.weight.shape == (channels + outputs, dec.SPADE_HIDDEN, 3, 3)
        assert after.composed_shortcut.shortcut_weight.shape == (outputs, channels, 1, 1)
        assert after.composed_shortcut.weight.is_contiguous(memory_format=torch.channels_last)
        assert not hasattr(after, "norm_s") and not hasattr(after, "conv_s")
    assert set(composed.state_dict()) == set(fused.state_dict()) - {"up_0.conv_s.weight", "up_1.conv_s.weight"}
    with pytest.raises(RuntimeError, match="already composed"):
        composed.use_composed_shortcuts()


def test_composing_needs_the_fused_spades(plain: dec.SPADEDecoder) -> None:
    with pytest.raises(RuntimeError, match="after use_fused_spade"):
        plain.use_composed_shortcuts()
    assert plain.up_0.composed_shortcut is None


def _meta_decoder_gflop(compose: bool) -> float:
    """Convolution GFLOP of the fused decoder on one 64x64 feature, shapes only (meta device)."""
    with torch.device("meta"):
        net = dec.build()
    dec.finalize(net)
    net.use_fused_spade()
    if compose:
        net.use_composed_shortcuts()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        net(torch.zeros(1, dec.FEATURE_CHANNELS, 64, 64, device="meta"))
    return counter.get_total_flops() / 1e9


def test_composing_saves_38_7_gflop_per_frame() -> None:
    """Beta's 3x3 convolution over the 128 hidden channels loses 512 - 256 outputs at 128x128 and 256 - 64 at
    256x256: 2·128·9·(256·128² + 192·256²) FLOPs, 38.65 of the fused decoder's 789.5 GFLOP per frame."""
    before, after = _meta_decoder_gflop(compose=False), _meta_decoder_gflop(compose=True)
    print(f"fused decoder, 64x64 feature: {before:.2f} GFLOP per frame, composed {after:.2f}")
    assert before - after == pytest.approx(2 * 128 * 9 * (256 * 128**2 + 192 * 256**2) / 1e9)
    assert before - after == pytest.approx(38.65, abs=0.01)


def test_the_composed_decoder_decodes_as_the_fused_and_the_plain_one(
    decodes: dict[str, tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """In fp32 only rounding differs: >= 100 dB (the composed beta's bias 1% off gives 84 dB)."""
    rgb = decodes["composed"][0]
    against = {name: _psnr(rgb, decodes[name][0]) for name in ("fused", "plain")}
    print(f"composed decoder, fp32, 16x16: PSNR {against['fused']:.1f} dB vs fused, {against['plain']:.1f} dB vs plain")
    assert against["fused"] >= 100 and against["plain"] >= 100
    assert rgb.std().item() > 0.05

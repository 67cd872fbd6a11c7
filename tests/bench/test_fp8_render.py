"""The FP8 emulation rounds as e4m3 does, scales each weight channel on its own, and stays close to fp32."""

from __future__ import annotations

import torch
from torch import nn

from bench.fp8_render import E4M3_MAX, SETS, activation_scale, e4m3, fp8_conv, render_with_fp8, weight_scales


def test_e4m3_keeps_representable_values_and_rounds_the_rest_to_three_mantissa_bits() -> None:
    exact = torch.tensor([0.0, 1.0, -1.5, 448.0, 0.015625])
    assert torch.equal(e4m3(exact), exact)
    assert e4m3(torch.tensor([1.06])).item() == 1.0 and e4m3(torch.tensor([1.07])).item() == 1.125


def test_scales_map_the_largest_magnitude_onto_the_largest_e4m3_value_per_output_channel() -> None:
    weight = torch.stack([torch.full((3, 3, 3), 2.0), torch.full((3, 3, 3), -0.001)])
    assert torch.allclose(weight_scales(weight) * E4M3_MAX, torch.tensor([2.0, 0.001]))
    assert torch.isclose(activation_scale(torch.tensor([-7.0, 3.0])) * E4M3_MAX, torch.tensor(7.0))


def test_an_fp8_convolution_is_within_e4m3s_rounding_of_fp32_and_not_equal_to_it() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 8, 3, padding=1, bias=False)
    conv.weight.data[0] *= 1e-5  # a quiet channel keeps its precision with a scale of its own
    x = torch.randn(2, 16, 12, 12)
    with torch.no_grad():
        exact, fp8 = conv(x), fp8_conv(conv, x)
    per_channel = lambda t: t.pow(2).sum(dim=(0, 2, 3)).sqrt()  # noqa: E731
    error = per_channel(fp8 - exact) / per_channel(exact)
    assert (error > 1e-4).all() and (error < 0.08).all(), error


def test_the_chosen_convolutions_and_only_they_run_in_fp8() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 1))
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        exact = net(x)
        first_only = render_with_fp8(net, (x,), ["0"])
        expected = net[2](net[1](fp8_conv(net[0], x)))
        assert torch.equal(first_only, expected) and not torch.equal(first_only, exact)
        assert torch.equal(net(x), exact), "the hooks are removed afterwards"
    assert SETS["every convolution"]("anything") and not SETS["decoder.up_1.conv_0 alone"]("decoder.up_1.conv_1")

"""The warp's 3-D convolutions over depth planes compute the same function as the plain modules."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.networks.depth_planes import PlanesConv3d, PlanesHeads, column_stack, column_weight
from engine.networks.warp_network import WarpingNetwork


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(("channels", "outputs", "k"), [(5, 3, 3), (20, 22, 7), (16, 8, 3)])
def test_a_planes_convolution_equals_the_3d_convolution(channels: int, outputs: int, k: int) -> None:
    torch.manual_seed(0)
    conv = nn.Conv3d(channels, outputs, kernel_size=k, padding=k // 2)
    x = torch.randn(2, channels, 5, 9, 11)
    with torch.no_grad():
        assert relative(PlanesConv3d(conv)(x), conv(x)) < 1e-5
        channels_last = x.contiguous(memory_format=torch.channels_last_3d)
        assert relative(PlanesConv3d(conv)(channels_last), conv(x)) < 1e-5


def test_a_kxk_convolution_equals_a_kx1_convolution_over_the_column_stacked_input() -> None:
    torch.manual_seed(0)
    x, weight = torch.randn(2, 5, 9, 11), torch.randn(3, 5, 7, 7)
    expected = F.conv2d(x, weight, padding=3)
    assert torch.allclose(F.conv2d(column_stack(x, 7), column_weight(weight), padding=(3, 0)), expected, atol=1e-4)


def test_the_fused_heads_equal_the_mask_and_occlusion_convolutions() -> None:
    torch.manual_seed(1)
    depth = 4
    mask = nn.Conv3d(6, 5, kernel_size=3, padding=1)
    occlusion = nn.Conv2d(6 * depth, 1, kernel_size=3, padding=1)
    prediction = torch.randn(3, 6, depth, 8, 8)
    with torch.no_grad():
        mask_logits, occlusion_logits = PlanesHeads(mask, occlusion, depth)(prediction)
        assert relative(mask_logits, mask(prediction)) < 1e-5
        assert relative(occlusion_logits, occlusion(prediction.flatten(1, 2))) < 1e-5


def test_only_cubic_same_padded_convolutions_are_converted() -> None:
    with pytest.raises(ValueError, match="cubic"):
        PlanesConv3d(nn.Conv3d(4, 4, kernel_size=(1, 3, 3), padding=(0, 1, 1)))
    with pytest.raises(ValueError, match="occlusion"):
        PlanesHeads(nn.Conv3d(4, 2, 3, padding=1), nn.Conv2d(4, 1, 3, padding=1), depth=2)


def test_a_warp_network_on_depth_planes_warps_as_before() -> None:
    torch.manual_seed(2)
    net = WarpingNetwork(
        num_kp=4, feature_channels=8, depth=4, compressed=2, hourglass_widths=(8, 16, 32), out_channels=16
    ).eval()
    for module in net.modules():
        if isinstance(module, (nn.Conv2d, nn.Conv3d)):
            nn.init.normal_(module.weight, std=0.2)
    planes = copy.deepcopy(net)
    planes.dense_motion_network.use_depth_planes()
    feature = torch.randn(2, 8, 4, 16, 16)
    kp_source = (torch.rand(2, 4, 3) - 0.5) * 0.6
    kp_driving = kp_source + 0.05 * torch.randn(2, 4, 3)
    with torch.no_grad():
        expected = net(feature, kp_source, kp_driving)
        # fp32 sums in another order, through softmax and sampling: 1.05e-5 on an AVX2 CPU, ~1 for a wrong conversion.
        assert relative(planes(feature, kp_source, kp_driving), expected) < 1e-4
        assert float(F.mse_loss(expected, torch.zeros_like(expected))) > 0

"""Specification of the motion extractor: official layout, output order, LayerNorm/GRN math, fp16, parity.

Weights are deterministic random ones in the official layout; the poses they read are not a face's.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.networks import load_network
from engine.networks import motion_extractor as me
from engine.networks.checkpoints import read_checkpoint
from tests.engine.networks.reference import max_rel_err, reference_modules

NAME = "motion_extractor"
SHAPES = {"pitch": (66,), "yaw": (66,), "roll": (66,), "t": (3,), "exp": (63,), "scale": (1,), "kp": (63,)}


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def outputs(network: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return network(images)


def test_state_dict_has_the_official_keys_and_shapes() -> None:
    net = me.build()
    state = net.state_dict()
    assert len(state) == 212
    assert all(key.startswith("detector.") for key in state)
    assert state["detector.downsample_layers.0.0.weight"].shape == (96, 3, 4, 4)
    assert state["detector.downsample_layers.3.0.weight"].shape == (384,)
    assert state["detector.downsample_layers.3.1.weight"].shape == (768, 384, 2, 2)
    assert state["detector.stages.2.8.dwconv.weight"].shape == (384, 1, 7, 7)
    assert state["detector.stages.2.8.grn.gamma"].shape == (1, 1, 1, 1536)
    assert state["detector.fc_kp.weight"].shape == (63, 768)
    assert sum(p.numel() for p in net.parameters()) == 28_118_728


def test_build_takes_its_shapes_from_the_state_dict() -> None:
    small = me.MotionExtractor(me.ConvNeXtV2Detector(depths=(1, 2, 1, 1), dims=(8, 16, 24, 32), num_kp=5, num_bins=7))
    rebuilt = me.build(small.state_dict())
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in small.state_dict().items()}


def test_outputs_come_in_the_reference_order_and_shapes(outputs: tuple[torch.Tensor, ...]) -> None:
    assert me.HEAD_NAMES == tuple(SHAPES)
    assert [tuple(o.shape) for o in outputs] == [(2, *shape) for shape in SHAPES.values()]
    assert all(o.dtype == torch.float32 and torch.isfinite(o).all() for o in outputs)


def test_each_output_is_its_own_head() -> None:
    """Zero weights and bias = head index: output i must be head HEAD_NAMES[i]."""
    net = me.MotionExtractor(me.ConvNeXtV2Detector(depths=(1, 1, 1, 1), dims=(8, 8, 8, 8)))
    with torch.no_grad():
        for index, name in enumerate(me.HEAD_NAMES):
            head = getattr(net.detector, f"fc_{name}")
            head.weight.zero_()
            head.bias.fill_(float(index))
        outputs = net(torch.rand(1, 3, 64, 64))
    assert [o.unique().tolist() for o in outputs] == [[float(i)] for i in range(len(me.HEAD_NAMES))]


def test_random_weights_read_plausible_motion(outputs: tuple[torch.Tensor, ...]) -> None:
    pitch, yaw, roll, t, exp, scale, kp = outputs
    for logits in (pitch, yaw, roll):
        assert (logits.std(dim=1) > 0.3).all(), "pose logits must be spread over the 66 bins"
    assert kp.abs().max() < 1.5 and kp.std() > 0.1
    assert exp.abs().max() < 0.5
    assert (scale > 0.5).all()
    assert not torch.allclose(kp[0], kp[1]), "two images must give two readings"


def test_batch_of_two_equals_two_batches_of_one(
    network: nn.Module, images: torch.Tensor, outputs: tuple[torch.Tensor, ...]
) -> None:
    with torch.no_grad():
        singles = [network(images[i : i + 1]) for i in range(2)]
    for position, batched in enumerate(outputs):
        assert max_rel_err(torch.cat([s[position] for s in singles]), batched) < 1e-5


def test_folding_changes_nothing_as_there_is_no_batchnorm(
    checkpoint: Path, network: nn.Module, images: torch.Tensor, outputs: tuple[torch.Tensor, ...]
) -> None:
    folded = load_network(NAME, checkpoint, fold_batchnorm=True)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in folded.modules())
    with torch.no_grad():
        for got, expected in zip(folded(images), outputs):
            assert max_rel_err(got, expected) < 1e-5


@pytest.mark.slow
def test_fp16_stays_close_to_fp32(checkpoint: Path) -> None:
    """Deployed fp32 (as Ditto's TRT engine); fp16 is checked loosely. CPU fp16 convs are slow: 64x64 there."""
    device, size = ("cuda", 256) if torch.cuda.is_available() else ("cpu", 64)
    image = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = load_network(NAME, checkpoint)(image)
        got = load_network(NAME, checkpoint, device=device, dtype=torch.float16)(image.to(device, torch.float16))
    for half, full in zip(got, expected):
        assert half.dtype == torch.float16
        assert max_rel_err(half.cpu(), full) < 2e-2


def _layer_norm_channels_first_np(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * weight[None, :, None, None] + bias[None, :, None, None]


def _grn_np(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    gx = np.sqrt((x.astype(np.float64) ** 2).sum(axis=(1, 2), keepdims=True))
    nx = gx / (gx.mean(axis=-1, keepdims=True) + 1e-6)
    return gamma * (x * nx) + beta + x


def test_channels_first_layer_norm_follows_the_formula() -> None:
    rng = np.random.default_rng(0)
    x = (3.0 + 2.0 * rng.standard_normal((2, 6, 5, 4))).astype(np.float32)
    weight, bias = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    got = me.layer_norm_channels_first(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias))
    np.testing.assert_allclose(got.numpy(), _layer_norm_channels_first_np(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_grn_follows_the_formula() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 4, 12)).astype(np.float32)
    gamma, beta = (
        rng.standard_normal((1, 1, 1, 12)).astype(np.float32),
        rng.standard_normal((1, 1, 1, 12)).astype(np.float32),
    )
    module = me.GRN(12)
    with torch.no_grad():
        module.gamma.copy_(torch.from_numpy(gamma))
        module.beta.copy_(torch.from_numpy(beta))
        got = module(torch.from_numpy(x))
    np.testing.assert_allclose(got.numpy(), _grn_np(x, gamma, beta), rtol=1e-5, atol=1e-5)


def test_grn_statistics_do_not_overflow_in_fp16() -> None:
    """A sum of 4096 squares of 8.0 is 262144, past fp16's 65504: the L2 norm must be taken in fp32."""
    x = torch.full((1, 64, 64, 4), 8.0)
    x[..., 1] = 4.0
    got = me.global_response_norm(x.half(), torch.ones(1, 1, 1, 4).half(), torch.zeros(1, 1, 1, 4).half())
    assert torch.isfinite(got).all()
    assert max_rel_err(got, me.global_response_norm(x, torch.ones(1, 1, 1, 4), torch.zeros(1, 1, 1, 4))) < 1e-3


def test_block_follows_the_published_formula() -> None:
    """x + pwconv2(GRN(GELU(pwconv1(LN_last(dwconv7x7(x)))))), the MLP acting per pixel on channels."""
    block = me.ConvNeXtV2Block(8)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    x = np.random.default_rng(2).standard_normal((1, 8, 6, 5)).astype(np.float32)

    y = F.conv2d(torch.from_numpy(x), block.dwconv.weight, block.dwconv.bias, padding=3, groups=8).detach().numpy()
    y = y.transpose(0, 2, 3, 1)
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    y = (y - mean) / np.sqrt(var + 1e-6) * block.norm.weight.detach().numpy() + block.norm.bias.detach().numpy()
    y = y @ block.pwconv1.weight.detach().numpy().T + block.pwconv1.bias.detach().numpy()
    y = 0.5 * y * (1.0 + np.vectorize(math.erf)(y / np.sqrt(2.0)))
    y = _grn_np(y, block.grn.gamma.detach().numpy(), block.grn.beta.detach().numpy())
    y = y @ block.pwconv2.weight.detach().numpy().T + block.pwconv2.bias.detach().numpy()
    expected = x + y.transpose(0, 3, 1, 2)

    with torch.no_grad():
        got = block(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_randomize_is_deterministic() -> None:
    def weights(seed: int) -> dict[str, torch.Tensor]:
        net = me.MotionExtractor(me.ConvNeXtV2Detector(depths=(1, 1, 2, 1), dims=(8, 16, 24, 32)))
        me.randomize(net, torch.Generator().manual_seed(seed))
        return net.state_dict()

    first, again, other = weights(5), weights(5), weights(6)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["detector.fc_kp.weight"], other["detector.fc_kp.weight"])


def test_rejects_an_image_of_the_wrong_size(network: nn.Module) -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        network(torch.zeros(1, 3, 250, 250))


def test_matches_the_reference_implementation(checkpoint: Path, network: nn.Module) -> None:
    """Skips without DITTO_REFERENCE_DIR; loads our random checkpoint strictly into the reference module."""
    reference = reference_modules().MotionExtractor()
    reference.load_state_dict(read_checkpoint(NAME, checkpoint), strict=True)
    reference.eval()
    image = torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        for ours, theirs in zip(network(image), reference(image)):
            assert max_rel_err(ours, theirs) < 1e-4

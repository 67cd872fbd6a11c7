"""Specification of the appearance extractor: official layout, shapes, BatchNorm folding, fp16, block math, parity.

Weights are deterministic random ones in the official layout; f_s from them is no face feature.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.networks import CheckpointError, load_network
from engine.networks import appearance_extractor as ae
from engine.networks.checkpoints import read_checkpoint
from tests.engine.networks.reference import max_rel_err, reference_modules

NAME = "appearance_extractor"


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def features(network: nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return network(images)


def test_state_dict_has_the_official_keys_and_shapes() -> None:
    state = ae.build().state_dict()
    assert len(state) == 107
    assert state["first.conv.weight"].shape == (64, 3, 3, 3)
    assert state["down_blocks.0.conv.weight"].shape == (128, 64, 3, 3)
    assert state["down_blocks.1.norm.running_var"].shape == (256,)
    assert state["second.weight"].shape == (512, 256, 1, 1)
    assert state["resblocks_3d.3dr5.conv2.weight"].shape == (32, 32, 3, 3, 3)
    assert "resblocks_3d.3dr0.norm1.num_batches_tracked" in state
    assert sum(p.numel() for p in ae.build().parameters()) == 836_224


def test_build_takes_its_shapes_from_the_state_dict() -> None:
    small = ae.AppearanceFeatureExtractor(widths=(8, 16, 32), volume=(4, 8), num_resblocks=2)
    rebuilt = ae.build(small.state_dict())
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in small.state_dict().items()}


def test_a_file_missing_a_key_is_refused_by_name(checkpoint: Path, tmp_path: Path) -> None:
    state = read_checkpoint(NAME, checkpoint)
    del state["resblocks_3d.3dr3.norm2.running_mean"]
    broken = tmp_path / "appearance_extractor.pth"
    torch.save(state, broken)
    with pytest.raises(CheckpointError, match="resblocks_3d.3dr3.norm2.running_mean"):
        load_network(NAME, broken)


def test_features_have_the_published_shape_and_a_useful_spread(features: torch.Tensor) -> None:
    assert features.shape == (2, 32, 16, 64, 64)
    assert features.dtype == torch.float32
    assert torch.isfinite(features).all()
    assert 0.1 < features.std().item() < 1.5


def test_batch_of_two_equals_two_batches_of_one(
    network: nn.Module, images: torch.Tensor, features: torch.Tensor
) -> None:
    with torch.no_grad():
        singles = torch.cat([network(images[i : i + 1]) for i in range(2)])
    assert max_rel_err(singles, features) < 1e-5


def test_folded_batchnorm_matches_unfolded(checkpoint: Path, images: torch.Tensor, features: torch.Tensor) -> None:
    folded = load_network(NAME, checkpoint, fold_batchnorm=True)
    remaining = [m for m in folded.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert len(remaining) == 6, "only the six pre-activation norm1 layers have no conv to fold into"
    with torch.no_grad():
        assert max_rel_err(folded(images), features) < 1e-5


@pytest.mark.slow
def test_fp16_agrees_with_fp32(checkpoint: Path) -> None:
    """The extractor runs folded in fp16. fp16 convs on the CPU are ~100x slower, so the CPU checks a 32x32 image."""
    device, size = ("cuda", 256) if torch.cuda.is_available() else ("cpu", 32)
    image = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = load_network(NAME, checkpoint)(image)
        half = load_network(NAME, checkpoint, device=device, dtype=torch.float16, fold_batchnorm=True)
        got = half(image.to(device, torch.float16))
    assert got.dtype == torch.float16
    assert max_rel_err(got.cpu(), expected) < 5e-3


def _batchnorm(x: np.ndarray, bn: nn.modules.batchnorm._BatchNorm) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = bn.running_mean.numpy().reshape(shape), bn.running_var.numpy().reshape(shape)
    weight, bias = bn.weight.detach().numpy().reshape(shape), bn.bias.detach().numpy().reshape(shape)
    return (x - mean) / np.sqrt(var + bn.eps) * weight + bias


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def _conv(x: np.ndarray, conv: nn.Conv2d | nn.Conv3d) -> np.ndarray:
    op = F.conv2d if isinstance(conv, nn.Conv2d) else F.conv3d
    return op(torch.from_numpy(x), conv.weight, conv.bias, padding=conv.padding).detach().numpy()


def test_forward_follows_the_published_formula() -> None:
    """conv-BN-ReLU, two (conv-BN-ReLU-avgpool2) blocks, 1x1 conv, channel-major split into (C,D), pre-act resblocks."""
    net = ae.AppearanceFeatureExtractor(widths=(8, 16, 32), volume=(4, 8), num_resblocks=2)
    ae.randomize(net, torch.Generator().manual_seed(11))
    net.eval()
    image = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)

    x = _relu(_batchnorm(_conv(image, net.first.conv), net.first.norm))
    for block in net.down_blocks:
        x = _relu(_batchnorm(_conv(x, block.conv), block.norm))
        n, c, h, w = x.shape
        x = x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))
    x = _conv(x, net.second)
    volume = np.stack([np.stack([x[:, c * 8 + d] for d in range(8)], axis=1) for c in range(4)], axis=1)
    for block in net.resblocks_3d:
        inner = _conv(_relu(_batchnorm(volume, block.norm1)), block.conv1)
        volume = volume + _conv(_relu(_batchnorm(inner, block.norm2)), block.conv2)

    with torch.no_grad():
        got = net(torch.from_numpy(image)).numpy()
    assert got.shape == (1, 4, 8, 4, 4)
    np.testing.assert_allclose(got, volume, rtol=1e-4, atol=1e-5 * np.abs(volume).max())


def test_randomize_is_deterministic() -> None:
    def weights(seed: int) -> dict[str, torch.Tensor]:
        net = ae.build()
        ae.randomize(net, torch.Generator().manual_seed(seed))
        return net.state_dict()

    first, again, other = weights(5), weights(5), weights(6)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["second.weight"], other["second.weight"])


def test_rejects_an_image_that_is_not_rgb(network: nn.Module) -> None:
    with pytest.raises(ValueError, match=r"expects an RGB batch \(B,3,H,W\)"):
        network(torch.zeros(1, 1, 256, 256))


def test_matches_the_reference_implementation(checkpoint: Path, network: nn.Module) -> None:
    """Skips without DITTO_REFERENCE_DIR; loads our random checkpoint strictly into the reference module."""
    reference = reference_modules().AppearanceFeatureExtractor()
    reference.load_state_dict(read_checkpoint(NAME, checkpoint), strict=True)
    reference.eval()
    image = torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        assert max_rel_err(network(image), reference(image)) < 1e-4

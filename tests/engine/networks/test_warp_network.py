"""Specification of the warp network: official layout, conventions of the dense motion, batching, folding, fp16, parity.

Weights are deterministic random ones in the official layout; the warped features are no face.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from engine.networks import dense_motion as dm
from engine.networks import load_network
from engine.networks import warp_network as wn
from engine.networks.checkpoints import read_checkpoint
from tests.engine.networks.reference import max_rel_err, reference_modules

NAME = "warp_network"
SMALL = {
    "num_kp": 3,
    "feature_channels": 4,
    "depth": 4,
    "compressed": 2,
    "hourglass_widths": (4, 8, 16),
    "out_channels": 8,
}


def warp_inputs(batch: int, seed: int, size: tuple[int, int, int, int] = (32, 16, 64, 64), num_kp: int = 21):
    """Appearance volume O(0.5) and keypoints inside the volume; driving = source moved by ~0.05."""
    g = torch.Generator().manual_seed(seed)
    feature = 0.5 * torch.randn(batch, *size, generator=g)
    kp_source = 0.7 * (2 * torch.rand(batch, num_kp, 3, generator=g) - 1)
    kp_driving = kp_source + 0.05 * torch.randn(batch, num_kp, 3, generator=g)
    return feature, kp_source, kp_driving


def trilinear(volume: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Sample volume (C,D,H,W) at points (...,3) of (x,y,z): pixel = ((p+1)*size-1)/2, zeros outside."""
    _, depth, height, width = volume.shape
    pixel = [((points[..., a] + 1) * n - 1) / 2 for a, n in enumerate((width, height, depth))]
    low = [np.floor(p).astype(np.int64) for p in pixel]
    frac = [p - lo for p, lo in zip(pixel, low)]
    out = np.zeros((volume.shape[0], *points.shape[:-1]))
    for corner in itertools.product((0, 1), repeat=3):
        idx = [lo + c for lo, c in zip(low, corner)]
        weight = np.prod([f if c else 1 - f for f, c in zip(frac, corner)], axis=0)
        inside = np.all([(i >= 0) & (i < n) for i, n in zip(idx, (width, height, depth))], axis=0)
        x, y, z = (np.clip(i, 0, n - 1) for i, n in zip(idx, (width, height, depth)))
        out += volume[:, z, y, x] * np.where(inside, weight, 0.0)
    return out


def numpy_grid(depth: int, height: int, width: int) -> np.ndarray:
    x = np.array([2 * i / (width - 1) - 1 for i in range(width)])
    y = np.array([2 * j / (height - 1) - 1 for j in range(height)])
    z = np.array([2 * k / (depth - 1) - 1 for k in range(depth)])
    return np.stack(np.broadcast_arrays(x[None, None, :], y[None, :, None], z[:, None, None]), axis=-1)


def small_network(seed: int = 11) -> wn.WarpingNetwork:
    net = wn.WarpingNetwork(**SMALL)
    wn.randomize(net, torch.Generator().manual_seed(seed))
    return net.eval()


@pytest.fixture(scope="module")
def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return warp_inputs(2, seed=1)


@pytest.fixture(scope="module")
def outputs(network: nn.Module, inputs) -> torch.Tensor:
    with torch.no_grad():
        return network(*inputs)


@pytest.fixture(scope="module")
def first_single(network: nn.Module, inputs) -> torch.Tensor:
    with torch.no_grad():
        return network(*(x[:1] for x in inputs))


# --- layout -------------------------------------------------------------------------------------


def test_state_dict_has_the_official_keys_and_shapes() -> None:
    net = wn.build()
    state = net.state_dict()
    assert len(state) == 97
    assert sum(k.startswith("dense_motion_network.") for k in state) == 88
    prefix = "dense_motion_network."
    assert state[prefix + "mask.weight"].shape == (22, 142, 7, 7, 7)
    assert state[prefix + "occlusion.weight"].shape == (1, 2272, 7, 7)
    assert state[prefix + "compress.weight"].shape == (4, 32, 1, 1, 1)
    assert state[prefix + "norm.running_var"].shape == (4,)
    assert state[prefix + "hourglass.decoder.conv.weight"].shape == (142, 142, 3, 3, 3)
    assert state[prefix + "hourglass.encoder.down_blocks.0.conv.weight"].shape == (64, 110, 3, 3, 3)
    assert state[prefix + "hourglass.encoder.down_blocks.4.conv.weight"].shape == (1024, 512, 3, 3, 3)
    assert state[prefix + "hourglass.decoder.up_blocks.0.conv.weight"].shape == (512, 1024, 3, 3, 3)
    assert state[prefix + "hourglass.decoder.up_blocks.1.conv.weight"].shape == (256, 1024, 3, 3, 3)
    assert state[prefix + "hourglass.decoder.up_blocks.4.norm.num_batches_tracked"].shape == ()
    assert state["third.conv.weight"].shape == (256, 512, 3, 3)
    assert state["third.norm.running_mean"].shape == (256,)
    assert state["fourth.weight"].shape == (256, 256, 1, 1)
    assert sum(p.numel() for p in net.parameters()) == 45_529_829


def test_build_takes_its_shapes_from_the_state_dict() -> None:
    small = wn.WarpingNetwork(**SMALL)
    rebuilt = wn.build(small.state_dict())
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in small.state_dict().items()}


def test_randomize_is_deterministic() -> None:
    def weights(seed: int) -> dict[str, torch.Tensor]:
        net = wn.WarpingNetwork(**SMALL)
        wn.randomize(net, torch.Generator().manual_seed(seed))
        return net.state_dict()

    first, again, other = weights(5), weights(5), weights(6)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["fourth.weight"], other["fourth.weight"])


# --- block math, derived independently ----------------------------------------------------------


def test_coordinate_grid_is_corner_inclusive_and_ordered_xyz() -> None:
    grid = dm.coordinate_grid(3, 4, 5, torch.float32, torch.device("cpu"))
    assert grid.shape == (3, 4, 5, 3)
    np.testing.assert_allclose(grid.numpy(), numpy_grid(3, 4, 5), atol=1e-7)
    assert grid[0, 0, 0].tolist() == [-1.0, -1.0, -1.0]
    assert grid[-1, -1, -1].tolist() == [1.0, 1.0, 1.0]
    assert grid[0, 0, 1].tolist() == [-0.5, -1.0, -1.0], "x moves along W"
    assert grid[1, 0, 0].tolist() == [-1.0, -1.0, 0.0], "z moves along D"


def test_sample_volume_is_trilinear_with_zero_padding_and_half_voxel_corners() -> None:
    rng = np.random.default_rng(0)
    volume = rng.standard_normal((2, 3, 4, 5))
    points = rng.uniform(-1.3, 1.3, size=(2, 3, 4, 3))  # some points fall outside the volume
    got = dm.sample_volume(torch.from_numpy(volume)[None], torch.from_numpy(points)[None])[0]
    np.testing.assert_allclose(got.numpy(), trilinear(volume, points), atol=1e-12)


def test_sampling_at_the_corner_inclusive_grid_is_not_the_identity() -> None:
    """align_corners=False puts -1 on the outer face of the edge voxel, so a corner reads 1/8 of its voxel."""
    volume = np.random.default_rng(1).standard_normal((1, 3, 4, 5))
    grid = numpy_grid(3, 4, 5)
    got = dm.sample_volume(torch.from_numpy(volume)[None], torch.from_numpy(grid)[None])[0].numpy()
    np.testing.assert_allclose(got, trilinear(volume, grid), atol=1e-12)
    np.testing.assert_allclose(got[0, 0, 0, 0], volume[0, 0, 0, 0] / 8, atol=1e-12)
    assert np.abs(got - volume).max() > 0.1


def test_sparse_motions_put_the_identity_first_then_translate_by_source_minus_driving() -> None:
    grid = dm.coordinate_grid(2, 3, 4, torch.float64, torch.device("cpu"))
    g = torch.Generator().manual_seed(2)
    kp_source, kp_driving = torch.rand(2, 2, 5, 3, generator=g, dtype=torch.float64)
    motions = dm.sparse_motions(grid, kp_source, kp_driving)
    assert motions.shape == (2, 6, 2, 3, 4, 3)
    for b in range(2):
        assert torch.equal(motions[b, 0], grid)
        for k in range(5):
            torch.testing.assert_close(motions[b, k + 1], grid + (kp_source[b, k] - kp_driving[b, k]))


def test_heatmaps_are_driving_minus_source_gaussians_of_variance_one_hundredth() -> None:
    grid = dm.coordinate_grid(3, 5, 5, torch.float64, torch.device("cpu"))
    kp_source = torch.tensor([[[0.5, 0.0, 0.0], [0.1, -0.2, 0.3]]], dtype=torch.float64)
    kp_driving = torch.tensor([[[0.0, 0.0, 0.0], [-0.4, 0.4, 0.0]]], dtype=torch.float64)
    heat = dm.keypoint_heatmaps(grid, kp_source, kp_driving).numpy()
    assert heat.shape == (1, 3, 3, 5, 5)
    assert not heat[0, 0].any(), "channel 0 is the zero background"
    points = numpy_grid(3, 5, 5)

    def gaussian(kp: np.ndarray) -> np.ndarray:
        return np.exp(-((points - kp) ** 2).sum(-1) / (2 * 0.01))

    for k in range(2):
        expected = gaussian(kp_driving[0, k].numpy()) - gaussian(kp_source[0, k].numpy())
        np.testing.assert_allclose(heat[0, k + 1], expected, atol=1e-12)
    assert heat[0, 1, 1, 2, 2] == pytest.approx(1.0 - np.exp(-0.25 / 0.02)), (
        "driving keypoint 0 sits on the centre voxel"
    )


def test_motion_features_interleave_one_heatmap_and_the_sampled_channels_per_group() -> None:
    g = torch.Generator().manual_seed(3)
    feature = torch.randn(1, 2, 3, 4, 4, generator=g, dtype=torch.float64)
    kp_source, kp_driving = torch.rand(2, 1, 2, 3, generator=g, dtype=torch.float64) - 0.5
    inputs, motions = dm.motion_features(feature, kp_source, kp_driving)
    assert inputs.shape == (1, 3 * 3, 3, 4, 4), "(1 + K) groups of (1 heatmap + C channels)"
    grid = dm.coordinate_grid(3, 4, 4, torch.float64, torch.device("cpu"))
    heat = dm.keypoint_heatmaps(grid, kp_source, kp_driving)
    for group in range(3):
        torch.testing.assert_close(inputs[0, 3 * group], heat[0, group])
        sampled = trilinear(feature[0].numpy(), motions[0, group].numpy())
        np.testing.assert_allclose(inputs[0, 3 * group + 1 : 3 * group + 3].numpy(), sampled, atol=1e-12)


def test_blend_is_a_softmax_over_groups_weighting_the_motions() -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 4, 2, 3, 3, generator=g, dtype=torch.float64)
    motions = torch.randn(2, 4, 2, 3, 3, 3, generator=g, dtype=torch.float64)
    mask, deformation = dm.blend_motions(logits, motions)
    weights = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(1, keepdims=True)
    np.testing.assert_allclose(mask.numpy(), weights, atol=1e-12)
    np.testing.assert_allclose(deformation.numpy(), (weights[..., None] * motions.numpy()).sum(1), atol=1e-12)


def test_forward_warps_by_the_deformation_then_masks_by_the_occlusion() -> None:
    """out = fourth(third(trilinear(f_s at deformation) with (C,D) stacked channel-major)) * occlusion."""
    net = small_network()
    feature, kp_source, kp_driving = warp_inputs(1, seed=5, size=(4, 4, 8, 8), num_kp=3)
    with torch.no_grad():
        motion = net.dense_motion_network(feature, kp_source, kp_driving)
        warped = trilinear(feature[0].numpy(), motion.deformation[0].numpy())
        stacked = torch.from_numpy(warped.reshape(16, 8, 8)).float()[None]
        expected = net.fourth(net.third(stacked)) * motion.occlusion
        got = net(feature, kp_source, kp_driving)
    assert motion.mask.shape == (1, 4, 4, 8, 8) and motion.deformation.shape == (1, 4, 8, 8, 3)
    assert motion.occlusion.shape == (1, 1, 8, 8)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_both_grid_samples_go_through_the_instance_sampler() -> None:
    """Export code swaps ``sample_volume`` on the instance; the sparse-motion and the final warp sample must both use
    it."""
    net = small_network()
    calls = []

    def recording(volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        calls.append((tuple(volume.shape), tuple(grid.shape)))
        return dm.sample_volume(volume, grid)

    net.sample_volume = recording
    with torch.no_grad():
        net(*warp_inputs(1, seed=7, size=(4, 4, 8, 8), num_kp=3))
    assert calls == [((1, 2, 4, 8, 8), (1, 4 * 4, 8, 8, 3)), ((1, 4, 4, 8, 8), (1, 4, 8, 8, 3))]


def test_half_precision_keeps_the_geometry_in_float32() -> None:
    net = small_network().half()
    feature, kp_source, kp_driving = warp_inputs(1, seed=6, size=(4, 4, 8, 8), num_kp=3)
    with torch.no_grad():
        motion = net.dense_motion_network(feature.half(), kp_source.half(), kp_driving.half())
    assert motion.mask.dtype == motion.deformation.dtype == torch.float32
    assert motion.occlusion.dtype == torch.float16


def test_rejects_inputs_of_the_wrong_shape(network: nn.Module) -> None:
    feature, kp_source, kp_driving = warp_inputs(1, seed=0, size=(32, 16, 8, 8))
    with pytest.raises(ValueError, match=r"feature_3d of shape \(B,32,16,H,W\)"):
        network(torch.zeros(1, 32, 8, 64, 64), kp_source, kp_driving)
    with pytest.raises(ValueError, match="divisible by 32"):
        network(torch.zeros(1, 32, 16, 64, 48), kp_source, kp_driving)
    with pytest.raises(ValueError, match=r"kp_driving of shape \(1, 21, 3\)"):
        network(torch.zeros(1, 32, 16, 64, 64), kp_source, kp_driving[:, :20])
    with pytest.raises(ValueError, match=r"kp_source of shape \(1, 21, 3\)"):
        network(torch.zeros(1, 32, 16, 64, 64), kp_source.expand(2, -1, -1), kp_driving)


# --- the published network with the random checkpoint (about 2 s per frame on the CPU) ----------


@pytest.mark.slow
def test_output_has_the_published_shape_and_a_useful_spread(outputs: torch.Tensor) -> None:
    assert outputs.shape == (2, 256, 64, 64)
    assert outputs.dtype == torch.float32
    assert torch.isfinite(outputs).all()
    assert 0.05 < outputs.std().item() < 1.5


@pytest.mark.slow
def test_random_weights_give_an_unsaturated_mask_and_occlusion(network: nn.Module, inputs) -> None:
    with torch.no_grad():
        motion = network.dense_motion_network(*(x[:1] for x in inputs))
    peak = motion.mask.max(dim=1).values
    assert 0.1 < peak.mean().item() < 0.5, "the mask blends several motions, it is not one-hot"
    torch.testing.assert_close(motion.mask.sum(1), torch.ones_like(peak))
    occlusion = motion.occlusion
    assert occlusion.std().item() > 0.05
    assert ((occlusion > 0.02) & (occlusion < 0.98)).float().mean().item() > 0.99
    assert (motion.deformation - dm.coordinate_grid(16, 64, 64, torch.float32, torch.device("cpu"))).abs().max() > 0.01


@pytest.mark.slow
def test_batch_of_two_equals_two_batches_of_one(network: nn.Module, inputs, outputs, first_single) -> None:
    with torch.no_grad():
        second = network(*(x[1:] for x in inputs))
    error = max_rel_err(torch.cat([first_single, second]), outputs)
    print(f"warp batch of 2 vs two batches of 1: max relative error {error:.2e}")
    assert error < 2e-5
    assert max_rel_err(outputs[0], outputs[1]) > 0.1, "the two samples differ, so the comparison means something"


@pytest.mark.slow
def test_is_deterministic(network: nn.Module, inputs, first_single) -> None:
    with torch.no_grad():
        again = network(*(x[:1] for x in inputs))
    assert torch.equal(again, first_single)


def test_folding_batchnorm_preserves_the_function_exactly_in_float64() -> None:
    net = small_network().double()
    folded = copy.deepcopy(net)
    wn.finalize(folded, fold_batchnorm=True)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in folded.modules()), "all 12 pairs fold"
    feature, kp_source, kp_driving = (x.double() for x in warp_inputs(1, seed=8, size=(4, 4, 8, 8), num_kp=3))
    with torch.no_grad():
        assert max_rel_err(folded(feature, kp_source, kp_driving), net(feature, kp_source, kp_driving)) < 1e-10


@pytest.mark.slow
def test_folded_batchnorm_matches_unfolded(checkpoint: Path, inputs, first_single) -> None:
    """fp32 noise floor: a one-ulp (1e-7) input perturbation moves this random network's output by ~8e-6."""
    folded = load_network(NAME, checkpoint, fold_batchnorm=True)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in folded.modules())
    with torch.no_grad():
        error = max_rel_err(folded(*(x[:1] for x in inputs)), first_single)
    print(f"warp folded vs unfolded: max relative error {error:.2e}")
    assert error < 2e-5


@pytest.mark.slow
def test_fp16_agrees_with_fp32(checkpoint: Path) -> None:
    """Production runs the warp folded in fp16. CPU fp16 3-D convs are ~100x slower, so the CPU checks a small
    network."""
    if torch.cuda.is_available():
        feature, kp_source, kp_driving = warp_inputs(1, seed=9)
        full = load_network(NAME, checkpoint)
        half = load_network(NAME, checkpoint, device="cuda", dtype=torch.float16, fold_batchnorm=True)
        bound = 1e-2
    else:
        feature, kp_source, kp_driving = warp_inputs(1, seed=9, size=(4, 4, 8, 8), num_kp=3)
        full = small_network()
        half = small_network()
        wn.finalize(half, fold_batchnorm=True)
        half = half.half()
        bound = 5e-3
    device = next(half.parameters()).device
    with torch.no_grad():
        expected = full(feature, kp_source, kp_driving)
        got = half(feature.to(device, torch.float16), kp_source.to(device), kp_driving.to(device))
    assert got.dtype == torch.float16
    error = max_rel_err(got.cpu(), expected)
    print(f"warp fp16 vs fp32 ({device.type}): max relative error {error:.2e}")
    assert error < bound


@pytest.mark.slow
def test_matches_the_reference_implementation(checkpoint: Path, inputs, outputs) -> None:
    """Skips without DITTO_REFERENCE_DIR; loads our random checkpoint strictly into the reference module (batch 2)."""
    reference = reference_modules().WarpingNetwork(estimate_occlusion_map=True, flag_use_occlusion_map=True)
    reference.load_state_dict(read_checkpoint(NAME, checkpoint), strict=True)
    reference.eval()
    with torch.no_grad():
        expected = reference(*inputs)
    error = max_rel_err(outputs, expected)
    print(f"warp vs reference (batch 2): max relative error {error:.2e}")
    assert error < 1e-4

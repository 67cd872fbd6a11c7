"""Specification of the stitching network: official wrapped layout, the stitching formula, small corrections, parity.

Weights are deterministic random ones in the official layout, not the trained stitching MLP.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.networks import stitch_network as sn
from engine.networks.checkpoints import read_checkpoint
from tests.engine.networks.reference import reference_modules

NAME = "stitch_network"


@pytest.fixture(scope="module")
def keypoints() -> tuple[torch.Tensor, torch.Tensor]:
    """Source keypoints of a plausible scale and driving keypoints near them, batch of 2."""
    generator = torch.Generator().manual_seed(11)
    source = 0.4 * torch.randn(2, 21, 3, generator=generator)
    driving = source + 0.05 * torch.randn(2, 21, 3, generator=generator)
    return source, driving


def test_file_is_wrapped_under_retarget_shoulder_with_module_prefix(checkpoint: Path) -> None:
    raw = torch.load(checkpoint, weights_only=True)
    assert set(raw) == {"retarget_shoulder"}
    expected = {f"module.mlp.{i}.{p}" for i in (0, 2, 4, 6) for p in ("weight", "bias")}
    assert set(raw["retarget_shoulder"]) == expected
    assert raw["retarget_shoulder"]["module.mlp.0.weight"].shape == (128, 126)
    assert raw["retarget_shoulder"]["module.mlp.6.weight"].shape == (65, 64)
    assert sum(p.numel() for p in sn.build().parameters()) == 45_249


def test_output_is_the_driving_keypoints_shape_and_dtype(network: nn.Module, keypoints) -> None:
    source, driving = keypoints
    with torch.no_grad():
        out = network(source, driving)
    assert out.shape == (2, 21, 3)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_output_follows_the_stitching_formula(checkpoint: Path, network: nn.Module, keypoints) -> None:
    """delta = MLP(concat); every keypoint moves by its own 3-vector plus one shared (tx, ty, 0)."""
    source, driving = keypoints
    state = read_checkpoint(NAME, checkpoint)
    h = torch.cat([source.flatten(1), driving.flatten(1)], dim=1)
    for index in (0, 2, 4):
        h = torch.relu(h @ state[f"mlp.{index}.weight"].T + state[f"mlp.{index}.bias"])
    delta = h @ state["mlp.6.weight"].T + state["mlp.6.bias"]
    expected = driving.clone()
    for b in range(2):
        for k in range(21):
            expected[b, k] += delta[b, 3 * k : 3 * k + 3]
            expected[b, k, 0] += delta[b, 63]
            expected[b, k, 1] += delta[b, 64]
    with torch.no_grad():
        out = network(source, driving)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_inputs_are_not_modified(network: nn.Module, keypoints) -> None:
    source, driving = keypoints
    before = (source.clone(), driving.clone())
    with torch.no_grad():
        network(source, driving)
    assert torch.equal(source, before[0]) and torch.equal(driving, before[1])


def test_batch_of_two_equals_two_batches_of_one(network: nn.Module, keypoints) -> None:
    source, driving = keypoints
    with torch.no_grad():
        both = network(source, driving)
        singles = torch.cat([network(source[i : i + 1], driving[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(both, singles, rtol=1e-6, atol=1e-7)


def test_random_weights_correct_the_keypoints_by_a_few_percent(network: nn.Module, keypoints) -> None:
    source, driving = keypoints
    with torch.no_grad():
        correction = network(source, driving) - driving
    ratio = (correction.std() / driving.std()).item()
    assert 0.005 < ratio < 0.1, f"stitch correction is {ratio:.3%} of the keypoint spread"


def test_randomize_is_deterministic_per_generator() -> None:
    nets = [sn.build() for _ in range(3)]
    for net, seed in zip(nets, (5, 5, 6)):
        sn.randomize(net, torch.Generator().manual_seed(seed))
    same, other = nets[0].state_dict(), nets[1].state_dict()
    assert all(torch.equal(same[k], other[k]) for k in same)
    assert not torch.equal(same["mlp.0.weight"], nets[2].state_dict()["mlp.0.weight"])


@pytest.mark.parametrize(
    ("source_shape", "driving_shape", "message"),
    [((1, 20, 3), (1, 21, 3), "kp_source"), ((1, 21, 3), (63,), "kp_driving"), ((2, 21, 3), (1, 21, 3), "batch")],
)
def test_bad_keypoint_shapes_are_named_in_the_error(network: nn.Module, source_shape, driving_shape, message) -> None:
    with pytest.raises(ValueError, match=message):
        network(torch.zeros(source_shape), torch.zeros(driving_shape))


def test_matches_the_reference_stitching_network(checkpoint: Path, network: nn.Module, keypoints) -> None:
    reference = reference_modules().StitchingNetwork()
    reference.load_state_dict(read_checkpoint(NAME, checkpoint), strict=True)
    reference.eval()
    source, driving = keypoints
    with torch.no_grad():
        expected = reference(source, driving)
        out = network(source, driving)
    error = ((out - expected).abs().max() / expected.abs().max()).item()
    print(f"stitch_network parity: max|ours-ref|/max|ref| = {error:.3e}")
    assert error < 1e-4

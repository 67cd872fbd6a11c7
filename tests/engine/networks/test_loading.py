"""load_network: official file layouts load strictly; anything else is a clear error."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from engine.networks import (
    NETWORK_NAMES,
    OFFICIAL_FILENAMES,
    CheckpointError,
    load_network,
    write_random_checkpoints,
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_every_network_loads_its_official_file_in_eval_mode(checkpoint_dir, name: str) -> None:
    path = checkpoint_dir(name) / OFFICIAL_FILENAMES[name]
    net = load_network(name, path)
    assert not net.training
    assert all(p.dtype == torch.float32 for p in net.parameters())


def test_files_are_wrapped_as_the_official_code_expects(checkpoint_dir) -> None:
    directory = checkpoint_dir("stitch_network", "lmdm", "decoder")
    stitch = torch.load(directory / OFFICIAL_FILENAMES["stitch_network"], weights_only=True)
    assert set(stitch) >= {"retarget_shoulder"}
    assert all(k.startswith("module.") for k in stitch["retarget_shoulder"])
    lmdm = torch.load(directory / OFFICIAL_FILENAMES["lmdm"], weights_only=True)
    assert "cond_projection.weight" in lmdm["model_state_dict"]
    assert lmdm["model_state_dict"]["cond_projection.weight"].shape == (512, 1103)
    decoder = torch.load(directory / OFFICIAL_FILENAMES["decoder"], weights_only=True)
    assert {"fc.weight", "G_middle_0.conv_0.weight_orig", "G_middle_0.conv_0.weight_u"} <= set(decoder)


def test_a_missing_file_names_the_official_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="ditto_pytorch/models/warp_network.pth"):
        load_network("warp_network", tmp_path / "nope.pth")


def test_an_unknown_network_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="unknown network 'wrap_network'"):
        load_network("wrap_network", tmp_path / "x.pth")


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "stitch_network.pth"
    bad.write_bytes(b"definitely not a zip archive")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_network("stitch_network", bad)


def test_a_missing_key_is_named(checkpoint_dir, tmp_path: Path) -> None:
    raw = torch.load(checkpoint_dir("stitch_network") / "stitch_network.pth", weights_only=True)
    del raw["retarget_shoulder"]["module.mlp.4.bias"]
    path = tmp_path / "stitch_network.pth"
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match=r"missing key\(s\) \['mlp.4.bias'\]") as info:
        load_network("stitch_network", path)
    assert str(path) in str(info.value)


def test_an_unexpected_key_is_named(checkpoint_dir, tmp_path: Path) -> None:
    raw = torch.load(checkpoint_dir("appearance_extractor") / "appearance_extractor.pth", weights_only=True)
    raw["extra.weight"] = torch.zeros(3)
    path = tmp_path / "appearance_extractor.pth"
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match=r"unexpected key\(s\) \['extra.weight'\]"):
        load_network("appearance_extractor", path)


def test_a_wrong_shape_is_named_with_both_shapes(checkpoint_dir, tmp_path: Path) -> None:
    raw = torch.load(checkpoint_dir("stitch_network") / "stitch_network.pth", weights_only=True)
    raw["retarget_shoulder"]["module.mlp.6.bias"] = torch.zeros(64)
    path = tmp_path / "stitch_network.pth"
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match=r"'mlp.6.bias' has shape \(64,\), the network expects \(65,\)"):
        load_network("stitch_network", path)


def test_a_stitch_file_without_its_wrapper_is_refused(checkpoint_dir, tmp_path: Path) -> None:
    raw = torch.load(checkpoint_dir("stitch_network") / "stitch_network.pth", weights_only=True)
    path = tmp_path / "stitch_network.pth"
    torch.save({k.replace("module.", ""): v for k, v in raw["retarget_shoulder"].items()}, path)
    with pytest.raises(CheckpointError, match="no 'retarget_shoulder' entry"):
        load_network("stitch_network", path)


def test_random_checkpoints_are_deterministic_per_seed(tmp_path: Path) -> None:
    names = ("stitch_network", "appearance_extractor", "lmdm")
    first = write_random_checkpoints(tmp_path / "a", seed=3, names=names)
    second = write_random_checkpoints(tmp_path / "b", seed=3, names=names)
    other = write_random_checkpoints(tmp_path / "c", seed=4, names=names)
    for name in names:
        assert first[name].name == OFFICIAL_FILENAMES[name]
        assert _sha256(first[name]) == _sha256(second[name])
        assert _sha256(first[name]) != _sha256(other[name])

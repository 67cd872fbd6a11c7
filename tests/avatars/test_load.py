"""The demo avatar: registered once into the engine's cache, loaded from it after, registered again when it cannot
be. A portrait file: registered into a one-off cache that is gone once the avatar is loaded."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from avatars.load import DEMO_NAME, demo_avatar, demo_cache, load_or_register
from engine.assets import write_demo_portrait
from engine.networks import write_random_checkpoints

NETWORKS = ("motion_extractor", "appearance_extractor")
CPU = torch.device("cpu")


@pytest.mark.slow
def test_the_demo_portrait_is_registered_once_then_loaded(tmp_path: Path, checkpoint_dir, monkeypatch) -> None:
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path))
    checkpoints = checkpoint_dir(*NETWORKS)
    first = demo_avatar(checkpoints, CPU)
    manifest = demo_cache() / DEMO_NAME / "manifest.json"
    assert demo_cache().is_relative_to(tmp_path), "the engine's cache, not the user's avatars"
    written = manifest.read_text()

    again = demo_avatar(checkpoints, CPU)
    assert manifest.read_text() == written, "loaded from the cache, not registered again"
    assert torch.equal(again.f_s, first.f_s) and again.is_image

    (demo_cache() / DEMO_NAME / "tensors.safetensors").write_bytes(b"damaged")
    repaired = demo_avatar(checkpoints, CPU)
    assert torch.equal(repaired.f_s, first.f_s), "a damaged cache is registered again"

    write_random_checkpoints(tmp_path / "other", seed=1, names=NETWORKS)
    changed = demo_avatar(tmp_path / "other", CPU)
    assert not torch.equal(changed.f_s, first.f_s), "other checkpoints: registered again with them"
    assert demo_avatar(tmp_path / "other", CPU).manifest == changed.manifest


@pytest.mark.slow
def test_a_portrait_file_is_registered_into_a_cache_removed_once_loaded(
    tmp_path: Path, checkpoint_dir, monkeypatch
) -> None:
    portrait = write_demo_portrait(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    avatar = load_or_register(str(portrait), checkpoint_dir(*NETWORKS), CPU, random_weights=True)
    assert avatar.is_image and avatar.f_s.numel()
    assert list((tmp_path / "temp").iterdir()) == [], "the one-off cache outlived the load"

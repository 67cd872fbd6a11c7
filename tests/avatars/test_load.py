"""The demo avatar: registered once into the engine's cache, loaded from it after, registered again when it cannot
be."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from avatars.load import DEMO_NAME, demo_avatar, demo_cache
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

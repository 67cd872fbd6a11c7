"""Fixtures for driving one session's pipeline by hand: the real LMDM and stitching network on random weights, a synthetic image avatar."""

from __future__ import annotations

import pytest
import torch

from engine.audio.hubert import TorchHubertRunner
from engine.audio.standin_hubert import build_standin
from engine.backends.torch_backend import TorchBackend
from engine.engine import Engine
from engine.motion.vector import join_motion
from engine.runtime.avatars import LoadedAvatar

WIDTHS = {"scale": 1, "pitch": 66, "yaw": 66, "roll": 66, "t": 3, "exp": 63}


@pytest.fixture(scope="module")
def engine(checkpoint_dir) -> Engine:
    backend = TorchBackend(checkpoint_dir("lmdm", "stitch_network"), device="cpu", networks=("lmdm", "stitch_network"))
    return Engine(backend, TorchHubertRunner(build_standin()), steps=2)


@pytest.fixture(scope="module")
def avatar() -> LoadedAvatar:
    """An image avatar's device tensors (random motion); nothing here is rendered, so no appearance feature."""
    g = torch.Generator().manual_seed(0)
    source = {k: torch.randn(1, w, generator=g) for k, w in WIDTHS.items()}
    source["exp"] = source["exp"] * 0.05
    source["scale"] = 1 + 0.2 * torch.rand(1, 1, generator=g)
    source["kp"] = torch.randn(1, 63, generator=g) * 0.3
    return LoadedAvatar(
        name="synthetic", f_s=torch.zeros(1, 1), source=source, source_motion=join_motion(source)[0],
        canonical_kp=source["kp"][0], eye_open=torch.rand(1, 2, generator=g), eye_ball=torch.randn(1, 6, generator=g) * 0.01,
        paste=None, is_image=True,
    )

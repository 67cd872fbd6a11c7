"""Fixtures for driving sessions' pipelines by hand or through a runtime's ``step``: the real LMDM and stitching network
on
random weights, a synthetic image avatar (as the runtime loads it, and as a registered one to open sessions with)."""

from __future__ import annotations

import pytest
import torch

from avatars.cache import Avatar
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


def synthetic_source() -> dict[str, torch.Tensor]:
    """An image avatar's random source motion (seeded)."""
    g = torch.Generator().manual_seed(0)
    source = {k: torch.randn(1, w, generator=g) for k, w in WIDTHS.items()}
    source["exp"] = source["exp"] * 0.05
    source["scale"] = 1 + 0.2 * torch.rand(1, 1, generator=g)
    source["kp"] = torch.randn(1, 63, generator=g) * 0.3
    source["eye_open"] = torch.rand(1, 2, generator=g)
    source["eye_ball"] = torch.randn(1, 6, generator=g) * 0.01
    return source


@pytest.fixture(scope="module")
def registered_avatar() -> Avatar:
    """The synthetic avatar as a registered one (an 8x8 frame, no appearance feature) to open runtime sessions with."""
    source = synthetic_source()
    return Avatar(
        name="synthetic",
        f_s=torch.zeros(1, 1),
        **{k: source[k] for k in (*WIDTHS, "kp", "eye_open", "eye_ball")},
        M_c2o=torch.eye(3)[None],
        sc=source["kp"][0],
        mask_crop=torch.ones(8, 8),
        frames=torch.zeros(1, 8, 8, 3, dtype=torch.uint8),
        is_image=True,
        manifest={},
    )


@pytest.fixture(scope="module")
def avatar() -> LoadedAvatar:
    """An image avatar's device tensors (random motion); nothing here is rendered, so no appearance feature."""
    source = synthetic_source()
    eye_open, eye_ball = source.pop("eye_open"), source.pop("eye_ball")
    return LoadedAvatar(
        name="synthetic",
        f_s=torch.zeros(1, 1),
        source=source,
        source_motion=join_motion(source)[0],
        canonical_kp=source["kp"][0],
        eye_open=eye_open,
        eye_ball=eye_ball,
        paste=None,
        is_image=True,
    )

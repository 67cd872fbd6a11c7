"""Fixtures of the network tests: each test module names its network in ``NAME``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from torch import nn

from engine.networks import OFFICIAL_FILENAMES, load_network


@pytest.fixture(scope="module")
def checkpoint(checkpoint_dir: Callable[..., Path], request: pytest.FixtureRequest) -> Path:
    """The module's network as a random checkpoint file in the official layout."""
    name = request.module.NAME
    return checkpoint_dir(name) / OFFICIAL_FILENAMES[name]


@pytest.fixture(scope="module")
def network(checkpoint: Path, request: pytest.FixtureRequest) -> nn.Module:
    """The module's network loaded from that file with ``load_network``."""
    return load_network(request.module.NAME, checkpoint)

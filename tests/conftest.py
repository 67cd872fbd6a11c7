"""Shared fixtures: deterministic random checkpoints in the official layout, written once per run, and a real face."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.networks import OFFICIAL_FILENAMES, write_random_checkpoints

torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

INTEGRATIONS = Path(__file__).resolve().parent / "integrations"


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """scripts/test.sh's second run (DITTO_TESTS=integrations, in .venv-integrations) collects tests/integrations
    alone, whatever other paths its arguments name: the rest of the suite ran in the first environment."""
    if os.environ.get("DITTO_TESTS") != "integrations":
        return None
    inside = collection_path == INTEGRATIONS or INTEGRATIONS in collection_path.parents
    return None if inside or collection_path in INTEGRATIONS.parents else True


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A directory of random official-layout checkpoints; call with network names to write only those."""
    directory = tmp_path_factory.mktemp("checkpoints")

    def ensure(*names: str) -> Path:
        wanted = names or tuple(OFFICIAL_FILENAMES)
        missing = tuple(n for n in wanted if not (directory / OFFICIAL_FILENAMES[n]).exists())
        if missing:
            write_random_checkpoints(directory, seed=0, names=missing)
        return directory

    return ensure


@pytest.fixture(scope="session")
def astronaut() -> np.ndarray:
    """The 512x512 RGB astronaut photo shipped with scikit-image."""
    from skimage import data

    return data.astronaut()

"""Ditto's six networks as our own PyTorch modules, loading the official checkpoints as published.

Every network module in this package exposes the same three functions:
``build(state_dict=None)`` constructs the module shaped for a state dict (or the published
shapes), ``randomize(module, generator)`` fills it with deterministic random weights whose
outputs are finite and well spread, and ``finalize(module, fold_batchnorm)`` folds what is
constant once the weights are loaded.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from engine.networks.checkpoints import (
    NETWORK_NAMES,
    OFFICIAL_FILENAMES,
    CheckpointError,
    load_strict,
    read_checkpoint,
    wrap_state_dict,
)
from engine.networks.uninitialized import without_random_init

__all__ = [
    "NETWORK_NAMES",
    "OFFICIAL_FILENAMES",
    "CheckpointError",
    "load_network",
    "network_module",
    "write_random_checkpoints",
]


def network_module(name: str) -> ModuleType:
    """The Python module that implements network ``name`` (build, randomize, finalize)."""
    if name not in NETWORK_NAMES:
        raise CheckpointError(f"unknown network {name!r}; expected one of {', '.join(NETWORK_NAMES)}")
    return importlib.import_module(f"engine.networks.{name}")


def load_network(
    name: str,
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    fold_batchnorm: bool = False,
) -> nn.Module:
    """Load an official Ditto checkpoint file into our module, strictly, in eval mode."""
    impl = network_module(name)
    state_dict = read_checkpoint(name, path)
    try:
        with without_random_init():  # the strict load below writes every tensor the random fills would
            net = impl.build(state_dict)
    except (KeyError, IndexError, ValueError) as exc:
        raise CheckpointError(f"{name}: {path} does not have the layout of the official file: {exc}") from exc
    load_strict(net, state_dict, name, path)
    impl.finalize(net, fold_batchnorm=fold_batchnorm)
    return net.to(device=device, dtype=dtype).eval()


def write_random_checkpoints(
    directory: str | Path, seed: int = 0, names: tuple[str, ...] = NETWORK_NAMES
) -> dict[str, Path]:
    """Write deterministic random weights for the networks, in the official file names and layouts.

    These stand in for the official weights, which cannot be downloaded here: every code path
    runs for real, but the pictures they produce are not faces.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for index, name in enumerate(NETWORK_NAMES):
        if name not in names:
            continue
        impl = network_module(name)
        net = impl.build()
        generator = torch.Generator().manual_seed(seed * 1000 + index)
        with torch.no_grad():
            impl.randomize(net, generator)
        path = directory / OFFICIAL_FILENAMES[name]
        tmp = path.with_suffix(".tmp")
        torch.save(wrap_state_dict(name, net.state_dict()), tmp)
        tmp.replace(path)
        written[name] = path
    return written

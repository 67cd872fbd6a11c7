"""Reading and writing checkpoint files in the official Ditto layout.

Each official `.pth` wraps its state dict differently; these functions undo and redo that
wrapping, and turn a strict-load failure into an error that names the file and the key.
Files are read with ``torch.load(weights_only=True)``: tensors and plain containers only,
never arbitrary pickled objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

OFFICIAL_FILENAMES: dict[str, str] = {
    "appearance_extractor": "appearance_extractor.pth",
    "motion_extractor": "motion_extractor.pth",
    "warp_network": "warp_network.pth",
    "decoder": "decoder.pth",
    "stitch_network": "stitch_network.pth",
    "lmdm": "lmdm_v0.4_hubert.pth",
}

NETWORK_NAMES: tuple[str, ...] = tuple(OFFICIAL_FILENAMES)

_STITCH_KEY = "retarget_shoulder"
_LMDM_KEY = "model_state_dict"


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, or does not fit the network."""


def read_checkpoint(name: str, path: str | Path) -> dict[str, torch.Tensor]:
    """Read an official checkpoint file and return the network's plain state dict."""
    path = Path(path)
    if name not in OFFICIAL_FILENAMES:
        raise CheckpointError(f"unknown network {name!r}; expected one of {', '.join(NETWORK_NAMES)}")
    if not path.is_file():
        raise CheckpointError(
            f"{name}: checkpoint file not found: {path} "
            f"(the official file is ditto_pytorch/models/{OFFICIAL_FILENAMES[name]})"
        )
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for a bad file
        raise CheckpointError(f"{name}: cannot read {path}: {exc}") from exc
    return unwrap_state_dict(name, raw, path)


def unwrap_state_dict(name: str, raw: Any, path: str | Path = "<memory>") -> dict[str, torch.Tensor]:
    """Undo the official file's wrapping the way the reference code does for each network."""
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{name}: {path} holds a {type(raw).__name__}, not a state dict")
    if name == "stitch_network":
        if _STITCH_KEY not in raw:
            raise CheckpointError(f"{name}: {path} has no {_STITCH_KEY!r} entry (keys: {sorted(raw)[:8]})")
        return {k.replace("module.", ""): v for k, v in raw[_STITCH_KEY].items()}
    if name == "lmdm":
        if _LMDM_KEY not in raw:
            raise CheckpointError(f"{name}: {path} has no {_LMDM_KEY!r} entry (keys: {sorted(raw)[:8]})")
        return dict(raw[_LMDM_KEY])
    return dict(raw)


def wrap_state_dict(name: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Wrap a plain state dict the way the official file for ``name`` is laid out."""
    plain = {k: v.detach().clone().contiguous() for k, v in state_dict.items()}
    if name == "stitch_network":
        return {_STITCH_KEY: {f"module.{k}": v for k, v in plain.items()}}
    if name == "lmdm":
        return {_LMDM_KEY: plain}
    return plain


def load_strict(module: nn.Module, state_dict: Mapping[str, torch.Tensor], name: str, path: str | Path) -> None:
    """Load ``state_dict`` into ``module`` with every key and shape checked; errors name file and key.

    The module takes the file's tensors as its own (``assign``: in the module's dtype, contiguous) instead of
    copying them into the tensors it was built with, which were left unwritten (``engine.networks.uninitialized``):
    copying wrote every weight a second time and touched all of the module's fresh memory (most of a CPU load).
    """
    expected = module.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(
                f"missing key(s) {missing[:5]}" + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )
        if unexpected:
            parts.append(
                f"unexpected key(s) {unexpected[:5]}"
                + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
            )
        raise CheckpointError(f"{name}: {path} does not fit the network: {'; '.join(parts)}")
    for key, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{name}: {path}: key {key!r} holds a {type(tensor).__name__}, not a tensor")
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(
                f"{name}: {path}: key {key!r} has shape {tuple(tensor.shape)}, "
                f"the network expects {tuple(expected[key].shape)}"
            )
    owned = {key: tensor.to(expected[key].dtype).contiguous() for key, tensor in state_dict.items()}
    module.load_state_dict(owned, strict=True, assign=True)

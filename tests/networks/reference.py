"""Access to a local checkout of the reference implementation, for parity tests only.

Set DITTO_REFERENCE_DIR to a checkout of antgroup/ditto-talkinghead to run them; the
reference code is never part of this repository. Without it the parity tests skip.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import pytest
import torch


def reference_modules() -> ModuleType:
    """The reference's ``core.models.modules`` package, or skip the calling test."""
    root = os.environ.get("DITTO_REFERENCE_DIR")
    if not root or not os.path.isdir(os.path.join(root, "core", "models", "modules")):
        pytest.skip("DITTO_REFERENCE_DIR does not point at a reference checkout")
    pytest.importorskip("einops")
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module("core.models.modules")


def max_rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max|ours − ref| / max|ref|: the parity measure used against the reference."""
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()

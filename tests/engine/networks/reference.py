"""Access to a local checkout of the reference implementation, for parity tests only.

Set DITTO_REFERENCE_DIR to a checkout of antgroup/ditto-talkinghead to run them; the
reference code is never part of this repository. Without it the parity tests skip.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from harness.reference_code import ReferenceUnavailable, import_reference, reference_root


def reference_modules() -> ModuleType:
    """The reference's ``core.models.modules`` package, or skip the calling test."""
    return reference_module("core.models.modules", "einops")


def reference_module(name: str, *requires: str) -> ModuleType:
    """The reference's module ``name`` (e.g. ``stream_pipeline_offline``), or skip the calling test when there is
    no checkout or a package the module imports (``requires``, e.g. librosa) is not installed."""
    try:
        reference_root()
    except ReferenceUnavailable as unavailable:
        pytest.skip(str(unavailable))
    for package in requires:
        pytest.importorskip(package, reason=f"the reference's {name} imports {package}")
    return import_reference(name)


def max_rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max|ours − ref| / max|ref|: the parity measure used against the reference."""
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()

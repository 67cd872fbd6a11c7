"""A local checkout of the reference implementation (antgroup/ditto-talkinghead), for parity tests and
side-by-side benchmarks only.

Set DITTO_REFERENCE_DIR to the root of a checkout (the folder holding ``core/``). The reference
code is never part of this repository and nothing at run time imports it.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

ENV = "DITTO_REFERENCE_DIR"


class ReferenceUnavailable(RuntimeError):
    """DITTO_REFERENCE_DIR is unset or does not point at a reference checkout."""


def reference_root() -> Path:
    """The checkout DITTO_REFERENCE_DIR names, or ReferenceUnavailable saying why not."""
    root = os.environ.get(ENV)
    if not root:
        raise ReferenceUnavailable(f"{ENV} is not set (point it at a checkout of antgroup/ditto-talkinghead)")
    if not (Path(root) / "core" / "models" / "modules").is_dir():
        raise ReferenceUnavailable(f"{ENV}={root} has no core/models/modules: not a ditto-talkinghead checkout")
    return Path(root)


def import_reference(module: str) -> ModuleType:
    """Import ``module`` (e.g. ``core.models.modules``) from the reference checkout."""
    root = str(reference_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(module)

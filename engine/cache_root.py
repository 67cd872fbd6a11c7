"""Where the engine keeps what it makes once and reuses: the random stand-in weights, torch.compile's cache, the demo
avatar."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE_DIR = "DITTO_CACHE_DIR"


def cache_root() -> Path:
    """``$DITTO_CACHE_DIR``, or ``~/.cache/ditto-live``."""
    return Path(os.environ.get(ENV_CACHE_DIR, Path.home() / ".cache" / "ditto-live"))

"""The synthetic runtime (tests/streaming/synthetic_runtime.py) admitting 2 live sessions: a full cluster of two
replicas is 4 sessions, few enough for two loaded CPU cores to encode."""

from __future__ import annotations

from serving.protocol import CoreConfig
from tests.streaming import synthetic_runtime

CAPACITY = 2


def build(config: CoreConfig):
    """The core's runtime and avatars (this runs in the core's own process, so the capacity is that core's alone)."""
    synthetic_runtime.CAPACITY = CAPACITY
    return synthetic_runtime.build(config)

"""The capacity each engine replica last reported, as this process's request router saw it.

A module of its own because Serve ships the router class by value (cloudpickle): a dict defined
beside it would be a copy in the ingress's process, while this module is imported there by name,
so the router and the ingress share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REPORTED: dict[str, dict[str, Any]] = {}
"""Replica id -> its last report (admitted, live, free, draining, renders, url, seq, answered), for every replica the
router routes to; ``{}`` for one that has not reported yet."""


def summary(figures: Mapping[str, Any]) -> dict[str, Any]:
    """What a replica's figures (``EngineReplica.figures``) put in a report: its capacity, its render queue (None: it
    takes no render jobs) and its HTTP URL (where the ingress sends render jobs)."""
    return {**figures["capacity"], "renders": figures["renders"], "url": figures["replica"]["url"]}

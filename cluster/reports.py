"""The capacity each engine replica last reported, as this process's request router saw it.

A module of its own because Serve ships the router class by value (cloudpickle): a dict defined
beside it would be a copy in the ingress's process, while this module is imported there by name,
so the router and the ingress share it.
"""

from __future__ import annotations

from typing import Any

REPORTED: dict[str, dict[str, Any]] = {}
"""Replica id -> its last report (admitted, live, free, draining, seq), for every replica the router routes to;
``{}`` for one that has not reported yet."""

"""How deep plain data (JSON, a cfg) nests: manifests and caches a user is handed are refused beyond a depth."""

from __future__ import annotations

from typing import Any


def nested_over(value: Any, limit: int) -> bool:
    """True when ``value`` nests lists and objects more than ``limit`` deep (walked without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False

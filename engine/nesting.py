"""How deep plain data (JSON, a cfg) nests: manifests and caches a user is handed are refused beyond a depth."""

from __future__ import annotations

import json
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


def load_json(text: str | bytes, limit: int, what: str) -> Any:
    """``text`` as JSON nested at most ``limit`` deep; ValueError naming ``what`` otherwise, never a RecursionError
    (the parser's own recursion gives out at about a thousand levels, deep inside the caller)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} is nested too deep") from None
    if nested_over(value, limit):
        raise ValueError(f"{what} is nested more than {limit} deep")
    return value

"""Who may reach a server: one bound to loopback needs no token, any other address one (given or generated)."""

from __future__ import annotations

import ipaddress
import secrets


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None) -> tuple[str | None, bool]:
    """(token to require, whether it was generated): beyond loopback a token is mandatory."""
    if token or is_loopback(host):
        return token or None, False
    return secrets.token_urlsafe(16), True

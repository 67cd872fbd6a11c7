"""Who may reach a server: loopback by default, a token beyond it."""

from __future__ import annotations

from serving.access import is_loopback, resolve_token


def test_a_token_is_required_beyond_loopback() -> None:
    assert resolve_token("127.0.0.1", None) == (None, False)
    assert resolve_token("localhost", "given") == ("given", False)
    assert resolve_token("0.0.0.0", "given") == ("given", False)
    token, generated = resolve_token("0.0.0.0", None)
    assert generated and len(token) >= 16
    assert resolve_token("::", None)[1] and not is_loopback("192.0.2.7") and is_loopback("::1")

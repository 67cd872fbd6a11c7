"""Who may reach a server: loopback by default, a token beyond it, and only by the names it is bound to."""

from __future__ import annotations

from serving.access import Access, is_loopback, resolve_token


def test_a_token_is_required_beyond_loopback() -> None:
    assert resolve_token("127.0.0.1", None) == (None, False)
    assert resolve_token("localhost", "given") == ("given", False)
    assert resolve_token("0.0.0.0", "given") == ("given", False)
    token, generated = resolve_token("0.0.0.0", None)
    assert generated and len(token) >= 16
    assert resolve_token("::", None)[1] and not is_loopback("192.0.2.7") and is_loopback("::1")


LOCAL = {"Host": "127.0.0.1:8080"}


def test_a_server_answers_only_the_names_it_is_bound_to() -> None:
    access = Access.bound(("127.0.0.1", 8080), None)
    assert access.check("GET", LOCAL) is None and access.check("GET", {"Host": "localhost:8080"}) is None
    refused = access.check("GET", {"Host": "evil.example:8080"})
    assert refused.status == 403 and "Host" in refused.text
    anywhere = Access.bound(("0.0.0.0", 8080), "t")
    assert anywhere.check("GET", {"Host": "box.lan:8080", "Authorization": "Bearer t"}) is None, "the token guards it"


def test_a_page_of_another_host_may_read_but_not_change_anything() -> None:
    access = Access.bound(("127.0.0.1", 8080), None)
    evil = {**LOCAL, "Origin": "http://evil.example"}
    assert access.check("GET", evil) is None, "reads are CORS's"
    assert access.check("POST", evil).status == 403
    assert access.check("GET", {**evil, "Upgrade": "websocket"}).status == 403
    assert access.check("POST", {**LOCAL, "Origin": "null"}).status == 403
    assert access.check("POST", {**LOCAL, "Origin": "http://localhost:8080"}) is None
    assert access.check("POST", LOCAL) is None, "no Origin: not a browser"


def test_the_token_comes_as_a_bearer_header_or_a_query_parameter() -> None:
    access = Access.bound(("127.0.0.1", 8080), "s3cret")
    assert access.check("GET", LOCAL).status == 401
    assert access.check("GET", {**LOCAL, "Authorization": "Bearer s3cret"}) is None
    assert access.check("GET", LOCAL, query_token="s3cret") is None
    assert access.check("GET", LOCAL, query_token="wrong").status == 401
    assert access.check("GET", LOCAL, query_token="sécret").status == 400

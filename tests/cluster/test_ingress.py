"""Which answers of a replica to a POST the ingress hands on to another replica."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray")
from cluster.ingress import SessionsIngress, refusal  # noqa: E402


def test_a_failing_full_or_draining_replica_hands_the_session_on_and_a_bad_request_does_not() -> None:
    assert refusal(503), "full, draining, or its service failed (the engine core exited): another replica may take it"
    assert not refusal(409), "the session exists"
    assert not refusal(400), "the request is bad wherever it goes"


def test_a_body_that_is_not_json_or_nests_too_deep_is_a_400_never_a_500() -> None:
    """Issue 38: the ingress caught only ValueError around its JSON parse; a body nested 100k deep raised past it."""
    ingress = object.__new__(SessionsIngress)  # create() reads the body before it needs any replica
    for body in (b"[" * 100_000 + b"]" * 100_000, b"\xff", b"{", b'{"a":' * 20 + b"1" + b"}" * 20):
        response = asyncio.run(ingress.create(body))
        answer = json.loads(response.body)
        assert response.status_code == 400 and answer["kind"] == "invalid", body[:20]
        assert answer["error"].startswith("POST /sessions takes JSON"), body[:20]

"""Which answers of a replica to a POST the ingress hands on to another replica."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from cluster.ingress import refusal  # noqa: E402


def test_a_failing_full_or_draining_replica_hands_the_session_on_and_a_bad_request_does_not() -> None:
    assert refusal(503, "the service is full")
    assert refusal(409, "the service has failed: the engine core exited with code -9")
    assert not refusal(409, "session 'a' exists")
    assert not refusal(400, "unknown field(s)")

"""The engine core, in this process: its answers to the front end's requests."""

from __future__ import annotations

from serving.core import EngineCore
from serving.protocol import CoreConfig, Done, EndSession, Opened, OpenSession, Refused
from serving.publisher import release_ring

RUNTIME = "tests.streaming.synthetic_runtime:build"


def test_the_engine_core_tells_service_clients_to_create_a_new_session_with_post() -> None:
    """The service's core answers a request for an ended session with the HTTP API's way to go on."""
    core = EngineCore(CoreConfig("inproc://requests", "inproc://events", runtime=RUNTIME))
    try:
        request = OpenSession("s1", "anna", overlap=10, latency="faithful", seed=0, controls=None, worker="inproc://")
        opened = core.handle(request)
        assert isinstance(opened, Opened), opened
        assert core.handle(EndSession("s1")) == Done()
        reply = core.handle(EndSession("s1"))
        assert reply == Refused("session s1 has ended; create a new one with POST /sessions", "closed")
    finally:
        for core_session in list(core.sessions.values()):
            release_ring(core_session)
        core.runtime.close()
        core.context.term()

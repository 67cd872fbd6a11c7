"""The HTTP side: token on every route beyond loopback, /metrics in Prometheus text, the preview page and its info."""

from __future__ import annotations

import asyncio
import re
import time

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from serving.http import app_runner, create_service_app
from streaming.output import SessionOutput
from streaming.sinks.rtmp import RtmpSink
from streaming.sinks.webrtc import WebRtcPreview
from tests.serving.inprocess import Stream, create_app
from tests.streaming.conftest import free_port
from tests.streaming.synthetic import SyntheticSession
from tests.streaming.test_output import Recorder

SDP = {"Content-Type": "application/sdp"}


def serve(app, scenario) -> None:
    async def run() -> None:
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            await scenario(client)
        finally:
            await client.close()

    asyncio.run(run())


def test_with_a_token_every_route_wants_it() -> None:
    session = SyntheticSession(64, 64, frames=1)
    app = create_app([Stream("0", session, SessionOutput(session), push=True)], token="s3cret")

    async def scenario(client: TestClient) -> None:
        for path in ("/info", "/metrics", "/push?session=0", "/"):
            response = await client.get(path)
            assert response.status == 401, path
            assert "token" in await response.text()
        assert (await client.get("/info", headers={"Authorization": "Bearer wrong"})).status == 401
        assert (await client.get("/info?token=s3cret")).status == 200
        assert (await client.get("/metrics", headers={"Authorization": "Bearer s3cret"})).status == 200
        response = await client.post("/whep/0?token=s3cret", data="v=0", headers={"Content-Type": "application/sdp"})
        assert response.status == 404 and "no WebRTC preview" in await response.text()
        assert (await client.post("/whep/0", data="v=0", headers={"Content-Type": "application/sdp"})).status == 401
        assert (await client.delete("/whep/0/someone")).status == 401

    serve(app, scenario)


def test_metrics_report_sessions_frames_encode_time_sinks_and_the_runtime_stats() -> None:
    session = SyntheticSession(64, 64, frames=12)
    output = SessionOutput(session, encoder="x264")
    output.add_sink(Recorder())
    output.add_sink(RtmpSink("rtmp://127.0.0.1:1/live/nowhere", output.request_keyframe))
    output.start()
    assert output.finished.wait(20)
    runtime = {"tick_wall_ms_p99": 12.5, "capacity": None, "ticks": 40}
    app = create_app([Stream("0", session, output)], notice="RANDOM WEIGHTS", runtime_metrics=lambda: runtime)

    async def scenario(client: TestClient) -> None:
        response = await client.get("/metrics")
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(await response.text())
            for s in family.samples
        }
        assert samples[("ditto_sessions", ())] == 0
        assert samples[("ditto_frames_encoded_total", (("encoder", "x264"), ("session", "0")))] == 12
        assert samples[("ditto_frames_sent_total", (("session", "0"), ("sink", "recorder")))] == 12
        assert samples[("ditto_frames_sent_total", (("session", "0"), ("sink", "rtmp")))] == 0
        assert samples[("ditto_frames_dropped_total", (("session", "0"), ("sink", "rtmp")))] == 12
        assert samples[("ditto_rtmp_connected", (("session", "0"),))] == 0
        assert ("ditto_rtmp_reconnects_total", (("session", "0"),)) in samples
        assert samples[("ditto_encode_milliseconds", (("quantile", "0.99"), ("session", "0")))] > 0
        assert samples[("ditto_session_frames_generated", (("session", "0"),))] == 12
        assert samples[("ditto_session_hop_ms_p99", (("session", "0"),))] == 1.5
        assert samples[("ditto_runtime_tick_wall_ms_p99", ())] == 12.5 and samples[("ditto_runtime_ticks", ())] == 40
        assert not any(name == "ditto_runtime_capacity" for name, _ in samples), "figures not measured are left out"
        info = await (await client.get("/info")).json()
        assert info == {"sessions": ["0"], "notice": "RANDOM WEIGHTS"}

    serve(app, scenario)
    output.stop()


def test_malformed_whep_offers_are_refused_with_400_and_other_bodies_with_415() -> None:
    """An m= line without formats, a bad rtpmap, no SDP at all: each a 400 naming the problem, never a 500."""

    async def scenario() -> None:
        from aiortc import RTCPeerConnection

        peer = RTCPeerConnection()
        peer.addTransceiver("video", direction="recvonly")
        peer.addTransceiver("audio", direction="recvonly")
        await peer.setLocalDescription(await peer.createOffer())
        good = peer.localDescription.sdp
        session = SyntheticSession(64, 64, frames=1)
        preview = WebRtcPreview(asyncio.get_running_loop(), lambda: None)
        client = TestClient(TestServer(create_app([Stream("0", session, SessionOutput(session), preview)])))
        await client.start_server()
        sdp = {"Content-Type": "application/sdp"}
        try:
            bodies = [
                re.sub(r"(m=video \d+ UDP/TLS/RTP/SAVPF)[ 0-9]*", r"\1", good),
                re.sub(r"a=rtpmap:97 \S+", "a=rtpmap:97 H264", good),
                re.sub(r"a=rtpmap:97 \S+", "a=rtpmap:xx H264/abc", good),
                "v=0\r\nm=video\r\n",
                "",
            ]
            for body in bodies:
                response = await client.post("/whep/0", data=body, headers=sdp)
                assert response.status == 400, (body, response.status, await response.text())
                assert "offer" in await response.text()
            response = await client.post("/whep/0", json={"sdp": good, "type": "offer"})
            assert response.status == 415 and "application/sdp" in await response.text()
            assert (await client.post("/whep/nobody", data=good, headers=sdp)).status == 404
            assert (await client.delete("/whep/0/nobody")).status == 404
            assert preview.viewers == 0
        finally:
            await client.close()
            await preview.aclose()
            await peer.close()

    asyncio.run(scenario())


def test_a_non_ascii_bearer_token_is_a_400() -> None:
    session = SyntheticSession(64, 64, frames=1)
    app = create_app([Stream("0", session, SessionOutput(session))], token="s3cret")

    async def scenario(client: TestClient) -> None:
        for encoding in ("utf-8", "latin-1"):
            reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
            request = "GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sécret\r\nConnection: close\r\n\r\n"
            writer.write(request.encode(encoding))
            await writer.drain()
            answer = (await asyncio.wait_for(reader.read(), 5)).decode("latin-1")
            writer.close()
            assert answer.startswith("HTTP/1.1 400"), (encoding, answer)
            assert "token" in answer

    serve(app, scenario)


def test_host_must_be_a_bound_name_and_origin_an_allowed_host() -> None:
    """DNS rebinding (a foreign Host) and cross-origin pages (a foreign Origin on a WebSocket or POST) get a 403."""
    session = SyntheticSession(64, 64, frames=1)
    app = create_app([Stream("0", session, SessionOutput(session), push=True)], bound=("127.0.0.1", 8080))

    async def scenario(client: TestClient) -> None:
        for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST:8080"):
            assert (await client.get("/info", headers={"Host": host})).status == 200, host
        for host in ("evil.example:8080", "127.0.0.1:9999", "127.0.0.1", "evil.example"):
            response = await client.get("/info", headers={"Host": host})
            assert response.status == 403 and "Host" in await response.text(), host
        local = {"Host": "127.0.0.1:8080"}
        response = await client.post("/whep/0", data="v=0", headers={**local, **SDP, "Origin": "http://evil.example"})
        assert response.status == 403 and "Origin" in await response.text()
        response = await client.get(
            "/push?session=0",
            headers={**local, "Origin": "http://evil.example", "Connection": "Upgrade", "Upgrade": "websocket"},
        )
        assert response.status == 403
        response = await client.get(
            "/push?session=0", headers={**local, "Origin": "null", "Connection": "Upgrade", "Upgrade": "websocket"}
        )
        assert response.status == 403
        for origin in ("http://127.0.0.1:8080", "http://localhost:8080"):
            response = await client.post("/whep/0", data="v=0", headers={**local, **SDP, "Origin": origin})
            assert response.status == 404, origin  # past the check: this stream has no preview
        assert (await client.post("/whep/0", data="v=0", headers={**local, **SDP})).status == 404, (
            "no Origin: not a browser"
        )
        assert (await client.get("/info", headers={**local, "Origin": "http://evil.example"})).status == 200, (
            "reads are CORS's"
        )

    serve(app, scenario)


def test_bound_to_every_interface_any_host_with_a_token_but_origin_is_same_origin() -> None:
    session = SyntheticSession(64, 64, frames=1)
    app = create_app([Stream("0", session, SessionOutput(session), push=True)], token="s3cret", bound=("0.0.0.0", 8080))

    async def scenario(client: TestClient) -> None:
        auth = {"Authorization": "Bearer s3cret"}
        assert (await client.get("/info", headers={**auth, "Host": "box.lan:8080"})).status == 200
        response = await client.post(
            "/whep/0", data="v=0", headers={**auth, **SDP, "Host": "box.lan:8080", "Origin": "http://box.lan:8080"}
        )
        assert response.status == 404
        response = await client.post(
            "/whep/0", data="v=0", headers={**auth, **SDP, "Host": "box.lan:8080", "Origin": "http://evil.example"}
        )
        assert response.status == 403

    serve(app, scenario)


def test_the_service_routes_get_the_host_check_too() -> None:
    class Budget:
        def capacity(self) -> dict:
            return {}

        def encoding(self) -> dict:
            return {}

    class Idle:
        sessions: dict = {}
        renders = None
        core_info = None
        budget = Budget()

        async def refresh(self) -> dict:
            return {}

    app = create_service_app(Idle(), bound=("127.0.0.1", 8080))

    async def scenario(client: TestClient) -> None:
        response = await client.post("/sessions", json={"avatar": "anchor"}, headers={"Host": "evil.example:8080"})
        assert response.status == 403
        assert (await client.get("/sessions", headers={"Host": "127.0.0.1:8080"})).status == 200

    serve(app, scenario)


def test_a_connection_that_never_finishes_its_request_headers_is_closed() -> None:
    session = SyntheticSession(64, 64, frames=1)

    async def scenario() -> None:
        runner = app_runner(create_app([Stream("0", session, SessionOutput(session))]), timeout=0.5)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            half = []
            for _ in range(5):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                half.append((reader, writer))
            started = time.monotonic()
            for reader, writer in half:
                assert await asyncio.wait_for(reader.read(), 3) == b"", "closed without an answer"
                writer.close()
            assert time.monotonic() - started < 2
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_the_token_never_reaches_a_log(caplog) -> None:
    """Issue 28: a token passed as ?token= was written to the access log."""
    import logging

    import aiohttp

    session = SyntheticSession(64, 64, frames=1)
    app = create_app([Stream("0", session, SessionOutput(session))], token="s3cret-token")

    async def scenario() -> None:
        runner = app_runner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as http:
                assert (await http.get(f"http://127.0.0.1:{port}/info?token=s3cret-token")).status == 200
                assert (await http.get(f"http://127.0.0.1:{port}/info?token=wrong")).status == 401
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
    assert caplog.records and not any("s3cret-token" in r.getMessage() for r in caplog.records)


PLAYER = "http://player.example:9000"


def test_an_allowed_origins_whep_player_gets_cors_answers_and_any_other_origin_none() -> None:
    session = SyntheticSession(64, 64, frames=1)

    async def scenario() -> None:
        preview = WebRtcPreview(asyncio.get_running_loop(), lambda: None)
        stream = Stream("0", session, SessionOutput(session), preview)
        app = create_app([stream], token="s3cret", bound=("127.0.0.1", 8080), origins=(PLAYER,))
        client = TestClient(TestServer(app))
        await client.start_server()
        local, auth = {"Host": "127.0.0.1:8080"}, {"Authorization": "Bearer s3cret"}
        asked = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        try:
            response = await client.options("/whep/0", headers={**local, **asked, "Origin": PLAYER})
            assert response.status == 204 and response.headers["Access-Control-Allow-Origin"] == PLAYER
            assert "POST" in response.headers["Access-Control-Allow-Methods"]
            allowed = set(response.headers["Access-Control-Allow-Headers"].split(", "))
            assert {"Authorization", "Content-Type"} <= allowed
            refused = await client.options("/whep/0", headers={**local, **asked, "Origin": "http://evil.example"})
            assert refused.status != 204 and "Access-Control-Allow-Origin" not in refused.headers

            response = await client.post("/whep/0", data="v=0", headers={**local, **auth, **SDP, "Origin": PLAYER})
            assert response.status == 400, "the access rules let the player's offer in (and it is a bad one)"
            assert response.headers["Access-Control-Allow-Origin"] == PLAYER
            assert "Location" in response.headers["Access-Control-Expose-Headers"]
            response = await client.post(
                "/whep/0", data="v=0", headers={**local, **auth, **SDP, "Origin": "http://evil.example"}
            )
            assert response.status == 403 and "Access-Control-Allow-Origin" not in response.headers
            response = await client.post("/whep/0", data="v=0", headers={**local, **SDP, "Origin": PLAYER})
            assert response.status == 401 and response.headers["Access-Control-Allow-Origin"] == PLAYER, "it reads why"
        finally:
            await client.close()
            await preview.aclose()

    asyncio.run(scenario())


def test_every_error_answer_is_json_naming_the_error() -> None:
    session = SyntheticSession(64, 64, frames=1)
    app = create_app(
        [Stream("0", session, SessionOutput(session), push=True)], token="s3cret", bound=("127.0.0.1", 8080)
    )

    async def scenario(client: TestClient) -> None:
        local, auth = {"Host": "127.0.0.1:8080"}, {"Authorization": "Bearer s3cret"}
        for method, path, headers, status in [
            ("GET", "/info", local, 401),
            ("GET", "/info", {"Host": "evil.example:8080", **auth}, 403),
            ("GET", "/nothing-here", {**local, **auth}, 404),
            ("PUT", "/info", {**local, **auth}, 405),
            ("GET", "/push", {**local, **auth}, 400),
            ("POST", "/whep/0", {**local, **auth, **SDP}, 404),
        ]:
            response = await client.request(method, path, headers=headers)
            assert response.status == status and response.content_type == "application/json", (path, status)
            assert isinstance((await response.json())["error"], str) and (await response.json())["error"]

    serve(app, scenario)


def test_push_names_its_session_rather_than_taking_the_first() -> None:
    session = SyntheticSession(64, 64, frames=1)
    app = create_app([Stream("0", session, SessionOutput(session), push=True)])

    async def scenario(client: TestClient) -> None:
        response = await client.get("/push", headers={"Connection": "Upgrade", "Upgrade": "websocket"})
        assert response.status == 400 and "/push?session=ID" in (await response.json())["error"]

    serve(app, scenario)

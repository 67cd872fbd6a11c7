"""The HTTP side: token on every route beyond loopback, /metrics in Prometheus text, the preview page and its info."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from streaming.app import Stream, create_app
from streaming.output import SessionOutput
from streaming.sinks.rtmp import RtmpSink
from tests.streaming.synthetic import SyntheticSession
from tests.streaming.test_output import Recorder


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
        response = await client.post("/offer?token=s3cret", json={"sdp": "v=0", "type": "offer"})
        assert response.status == 404 and "no WebRTC preview" in await response.text()

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

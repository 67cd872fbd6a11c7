"""bench.serve_start over an echo server: each start timed to /metrics and to its first RTMP picture, with its
timeline."""

from __future__ import annotations

import asyncio

import pytest

TIMELINE = "service ready 1.0 s after launch: engine core spawned 0.1, ready 0.9; 1 output worker(s) ready 0.5-0.5 s"


@pytest.mark.slow
def test_every_start_is_timed_to_its_first_picture_and_keeps_the_servers_timeline(tmp_path, monkeypatch) -> None:
    import bench.serve_start as serve_start
    from harness.nginx import SYSTEM_MODULE
    from tests.bench.echo import EchoServer

    if not SYSTEM_MODULE.exists():
        pytest.skip("needs nginx with libnginx-mod-rtmp (scripts/install_system_deps.sh)")

    class LoggingEcho(EchoServer):
        def start(self) -> LoggingEcho:
            super().start()
            self.log.write_text(f"2026-12-02 10:00:00,000 serving.service: {TIMELINE}\n")
            return self

    monkeypatch.setattr(serve_start, "LiveServer", LoggingEcho)
    args = serve_start.parse_args(
        ["--starts", "2", "--device", "cpu", "--wait", "30", "--out", str(tmp_path / "start.json")]
    )
    args.device = "cpu"
    result = asyncio.run(serve_start.measure(args, tmp_path))
    assert len(result["starts"]) == 2 and result["command"] == "apps.serve --demo"
    for start in result["starts"]:
        assert 0 < start["metrics_answer_s"] < 30 and 0 < start["first_rtmp_picture_s"] < 30, start
        assert start["timeline"] == TIMELINE

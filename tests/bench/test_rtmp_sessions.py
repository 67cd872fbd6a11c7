"""bench.rtmp_sessions end to end over echo sessions: every stream read back at 25 fps without drift."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_two_echo_sessions_stream_at_25_fps_without_drift_and_are_read_back(tmp_path, monkeypatch) -> None:
    """The benchmark's harness (nginx, pushers, readers, /metrics, the report) over echo sessions (the model is too slow
    here)."""
    import asyncio

    import bench.rtmp_sessions as sessions
    from harness.nginx import SYSTEM_MODULE
    from tests.bench.echo import EchoServer

    if not SYSTEM_MODULE.exists():
        pytest.skip("needs nginx with libnginx-mod-rtmp (scripts/install_system_deps.sh)")
    monkeypatch.setattr(sessions, "LiveServer", EchoServer)
    args = sessions.parse_args(
        ["--avatar", "echo", "--device", "cpu", "--sessions", "2", "--minutes", "0.1", "--out", "x.json"]
    )
    result = asyncio.run(sessions.measure(args, tmp_path))
    assert [s["session"] for s in result["streams"]] == [0, 1] and result["push_errors"] == []
    for stream in result["streams"]:
        assert stream["frames"] >= 140 and stream["fps"] == pytest.approx(25, abs=1), stream
        assert abs(stream["drift_ms"]) < 100 and stream["frames_missing"] == 0, stream
        assert -70 < stream["av_offset_range_ms"][0] <= stream["av_offset_range_ms"][1] <= 10, stream
        assert stream["deadline_misses"] == 0 and stream["reconnects"] == 0, stream
    assert "| 1 |" in sessions.table(result)

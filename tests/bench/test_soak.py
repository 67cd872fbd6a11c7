"""bench.soak end to end on the synthetic runtime: the service through its real command line, nginx-rtmp, pushers,
readers, churn, samples and the report, for a few windows."""

from __future__ import annotations

import asyncio

import pytest

from bench.soak import playback


def test_every_segment_closed_or_started_is_finished_exactly_once() -> None:
    told = [
        {"type": "end_of_segment", "segment": 0},
        {"type": "playback_started", "segment": 0},
        {"type": "playback_finished", "segment": 0, "interrupted": False},
        {"type": "interrupted", "segment": 1},
        {"type": "playback_finished", "segment": 1, "interrupted": True},
        {"type": "interrupted", "segment": None},
        {"type": "playback_started", "segment": 2},
    ]
    assert playback(told) == {"segments": 3, "interrupted": 1, "lost": [2], "twice": []}
    again = told + [{"type": "playback_finished", "segment": 2, "interrupted": True}] * 2
    assert playback(again)["lost"] == [] and playback(again)["twice"] == [2]


@pytest.mark.slow
def test_a_short_soak_on_the_synthetic_runtime_meets_its_targets(tmp_path) -> None:
    import bench.soak as soak
    from harness.nginx import SYSTEM_MODULE

    if not SYSTEM_MODULE.exists():
        pytest.skip("needs nginx with libnginx-mod-rtmp (scripts/install_system_deps.sh)")
    argv = ["--synthetic", "--sessions", "2", "--minutes", "0.25", "--window", "5", "--churn-every", "5"]
    args = soak.parse_args([*argv, "--warm-minutes", "0.05", "--out", str(tmp_path / "soak.json")])
    result = asyncio.run(soak.measure(args, tmp_path))
    summary = result["summary"]
    assert summary["met"] == {"drift": True, "memory": True, "playback": True, "requests": True}, summary
    assert summary["churned_sessions"] >= 1 and summary["churned_states"] == {"ended": summary["churned_sessions"]}
    assert summary["segments_interrupted"] >= 2 and summary["push_errors"] == summary["read_errors"] == 0, summary
    assert summary["requests"]["POST"] == 2 + summary["churned_sessions"] and summary["failed_requests"] == 0
    for stream in result["streams"]:
        assert len(stream["windows"]) >= 3 and stream["frames"] >= 25 * 12 and stream["gaps"] == 0, stream
        assert stream["repeated"] is not None and stream["windows"][1]["drift_ms"] is not None, stream
    kinds = {name.rsplit(" ", 1)[0] for name in result["samples"][-1]["rss_mb"]}
    assert {"front end", "engine core", "output worker"} <= kinds, kinds
    assert result["server_exit"] == 0 and result["machine"]["cores"] and "met" in soak.table(result)

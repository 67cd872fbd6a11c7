"""bench.agents end to end on the tests' synthetic service (the real front end, engine core process, output worker,
push WebSocket and WHEP, frames made in milliseconds, its avatar speaking what is pushed): two bots in processes of
their own for a few seconds, their reports read back as the benchmark summarises them, every marker accounted for."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT, REPO

pytest.importorskip("pipecat", reason=INTEGRATIONS_HINT)
pytest.importorskip("aiortc", reason=INTEGRATIONS_HINT)

from bench import agents
from harness.nginx import free_port
from tests.integrations.synthetic_service import start, stop

TOKEN = "s3cret"


def test_two_bots_hold_25_fps_pass_every_stop_once_and_import_no_torch(tmp_path, monkeypatch) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "tests.integrations.synthetic_service", str(port), TOKEN, "echo"]
    service = start(command, url, env, 60, {"Authorization": f"Bearer {TOKEN}"})
    monkeypatch.chdir(REPO)
    try:
        out = tmp_path / "agents.json"
        agents.main(["--service", url, "--token", TOKEN, "--bots", "2", "--minutes", "0.2", "--out", str(out)])
    finally:
        stop(service)
    result = json.loads(out.read_text())
    (phase,) = result["phases"]
    summary, reports = phase["bots_summary"], phase["bot_reports"]
    assert summary["reported"] == 2 and not phase.get("refused"), phase
    assert 24.0 <= summary["fps_min"] <= summary["fps_max"] <= 26.0, "each bot's own 25 fps clock"
    assert summary["stops_sent"] >= 2 and summary["stops_passed"] == summary["stops_sent"]
    assert summary["segments_started"] == summary["stops_sent"], "no interruptions: every segment stopped"
    assert summary["stops_mismatch"] == 0 and summary["bots_with_torch"] == 0 and summary["bots_with_errors"] == 0
    assert len({r["session"] for r in reports}) == 2 and len({r["pid"] for r in reports}) == 2
    for report in reports:
        assert report["speech_pictures"] > 0 and report["audio_seconds_out"] > 0, "speech came back from the service"
        assert report["service"]["released_in_window"] > 100, "the service's own counters of the bot's session"
        assert 0 < report["cores"] < 1 and report["max_rss_mb"] > 0
    markers, witness = summary["markers"], phase["witness"]
    assert summary["markers_sent"] >= 4 and markers["n"] == summary["markers_sent"], "every marker found"
    assert summary["markers_lost"] == {"cut": 0, "not_found": 0} and summary["empty_audio_frames"] == 0
    assert witness["found"] == witness["markers_sent"] >= 2, "the service's own viewer of bot 0 found its markers"
    assert 0 <= witness["added_by_the_bot"]["p50_ms"] <= 40, "what the bot path adds to the service's own viewer"
    assert summary["spread_ms"]["p50_ms"] <= 40, "the bots land together"

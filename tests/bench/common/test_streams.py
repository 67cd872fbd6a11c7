"""bench.common.streams: one stream's report from its packet log: rate, drift, gaps and A/V offset."""

from __future__ import annotations

import pytest

from bench.common.streams import stream_report
from harness.rtmp_read import PacketLog


def packets(seconds: float, rate: float, skip: set[int] = frozenset(), audio_lead: float = 0.0) -> PacketLog:
    """25 fps timestamps arriving at ``rate`` frames per wall second (from t=100), audio blocks alongside."""
    log = PacketLog()
    for i in range(int(seconds * 25)):
        if i in skip:
            continue
        arrival = 100 + i / rate
        log.video.append((i / 25, arrival))
        log.audio_end.append(((i + 1) / 25 + audio_lead, arrival))
    return log


def test_a_steady_stream_runs_at_25_fps_with_no_drift_and_audio_level_with_video() -> None:
    report = stream_report(packets(60, 25.0), 0, 1e9)
    assert report["frames"] == 1500 and report["fps"] == pytest.approx(25.0)
    assert report["drift_ms"] == pytest.approx(0, abs=0.1) and report["drift_slope_ms_per_min"] == pytest.approx(
        0, abs=0.1
    )
    assert report["timestamp_gaps"] == 0 and report["av_offset_range_ms"] == pytest.approx([0, 0], abs=0.1)


def test_a_stream_slower_than_its_timestamps_drifts_and_lost_frames_show_as_gaps() -> None:
    report = stream_report(packets(60, 24.9, skip={100, 101, 700}, audio_lead=0.03), 0, 1e9)
    assert report["fps"] == pytest.approx(24.9 * 1497 / 1500, abs=0.01), "three frames never arrived"
    assert report["drift_slope_ms_per_min"] == pytest.approx(60_000 * (25 / 24.9 - 1), rel=0.01)
    assert report["drift_ms"] > 150
    assert (report["timestamp_gaps"], report["frames_missing"]) == (2, 3)
    assert report["av_offset_ms"] == pytest.approx(30.0) and report["av_offset_change_ms"] == pytest.approx(0)


def test_only_the_measured_window_counts() -> None:
    report = stream_report(packets(20, 25.0), 104.0, 108.0)
    assert report["frames"] == 101 and report["seconds"] == pytest.approx(4.0)
    assert stream_report(PacketLog(), 0, 1)["frames"] == 0

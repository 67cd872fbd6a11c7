"""The latency split, the matching of WebRTC pictures to RTMP frames, and the command line."""

from __future__ import annotations

import pytest

from bench.common.glass_report import RELEASE_MS, rest_ms
from bench.glass_to_glass import parse_args
from harness.viewers import ViewerLog


def test_the_rest_is_what_a_path_adds_after_the_clock_showed_the_speech_and_the_output_released_it() -> None:
    assert RELEASE_MS == pytest.approx(10.0)
    assert rest_ms(588.0, 538.6) == pytest.approx(39.4)
    assert rest_ms(548.6, 538.6) == pytest.approx(0.0)


def test_a_viewer_frame_number_maps_to_the_rtmp_frame_with_the_same_picture() -> None:
    rtmp = {"a": [40], "b": [41], "c": [42], "same": [43, 44]}
    log = ViewerLog(
        "aiortc", frames=[(0, 1.0, "a"), (1, 1.04, "b"), (2, 1.08, "c"), (3, 1.12, "same"), (4, 1.16, "zzz")]
    )
    assert log.frame_offset(rtmp) == 40
    assert ViewerLog("aiortc", frames=[(0, 1.0, "same")]).frame_offset(rtmp) is None


def test_viewers_default_to_chromium_where_installed_else_aiortc(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.glass_to_glass as glass

    monkeypatch.setattr(glass, "chromium_path", lambda: None)
    assert parse_args(["--out", "x.json"]).viewers == ["aiortc"]
    assert parse_args(["--out", "x.json", "--viewer", "none"]).viewers == []
    with pytest.raises(SystemExit):
        parse_args(["--out", "x.json", "--viewer", "chromium"])
    monkeypatch.setattr(glass, "chromium_path", lambda: "/usr/bin/chromium")
    assert parse_args(["--out", "x.json", "--viewer", "auto", "aiortc"]).viewers == ["aiortc", "chromium"]


@pytest.mark.slow
def test_the_harness_finds_every_marker_on_rtmp_in_chromium_and_in_the_aiortc_viewer(tmp_path, monkeypatch) -> None:
    """The whole measurement against an echo server whose delay is known (the model is far too slow on a CPU for
    this)."""
    import asyncio

    import bench.glass_to_glass as glass
    from harness.nginx import SYSTEM_MODULE
    from harness.viewers import chromium_path
    from tests.bench.echo import DELAY_FRAMES, EchoServer

    if chromium_path() is None or not SYSTEM_MODULE.exists():
        pytest.skip("needs chromium and nginx with libnginx-mod-rtmp (scripts/install_system_deps.sh)")
    monkeypatch.setattr(glass, "LiveServer", EchoServer)
    args = parse_args(
        ["--avatar", "echo", "--device", "cpu", "--utterances", "2", "--duration", "1.2", "--wait", "5"]
        + ["--viewer", "chromium", "aiortc", "--out", str(tmp_path / "out.json")]
    )
    result = asyncio.run(glass.measure(args, tmp_path))
    assert result["markers_pushed"] == 4
    paths = result["paths"]
    assert set(paths) == {"rtmp", "chromium_audio", "chromium_video", "aiortc_audio", "aiortc_video"}
    for name, path in paths.items():
        assert path["n"] == 4, (name, result["markers"])
        assert DELAY_FRAMES / 25 - 0.15 < path["p50_ms"] / 1000 < 1.0, (name, path)
    assert result["viewers"]["aiortc"]["rtmp_frame_offset"] is not None
    from bench.common.glass_report import table

    assert "Chromium" in table(result) and "jitter buffer" in table(result)

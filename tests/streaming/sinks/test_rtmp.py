"""RTMP to a real nginx-rtmp on loopback: the stream arrives whole and in sync, and survives a server restart."""

from __future__ import annotations

import random
import time

import pytest

from engine.timebase import FPS
from streaming.output import SessionOutput
from streaming.output_settings import OutputSettings
from streaming.sinks.rtmp import Backoff, RtmpSink
from tests.streaming.conftest import free_port
from tests.streaming.media import ONE_FRAME, LiveReader
from tests.streaming.synthetic import SyntheticSession


def test_backoff_doubles_from_about_two_seconds_with_jitter_and_is_bounded() -> None:
    delays = list(Backoff().delays(random.Random(0)))
    assert len(delays) == 20
    assert 1.6 <= delays[0] <= 2.4 and 3.2 <= delays[1] <= 4.8
    assert max(delays) <= 30 * 1.2
    assert len(set(delays)) == len(delays), "jittered: reconnecting encoders do not stampede in step"


def test_urls_must_be_rtmp() -> None:
    with pytest.raises(ValueError, match="rtmp://"):
        RtmpSink("http://example.invalid/live", lambda: None)
    with pytest.raises(ValueError, match="control characters"):
        RtmpSink("rtmp://example.invalid/live\nforged", lambda: None)


def test_a_sink_that_gives_up_on_its_server_is_reported_once_by_the_output() -> None:
    reported: list[tuple[str, str]] = []
    session = SyntheticSession(64, 64, frames=25)
    output = SessionOutput(session, encoder="x264", on_sink_failed=lambda *failure: reported.append(failure))
    url = f"rtmp://127.0.0.1:{free_port()}/live/nobody"
    backoff = Backoff(first=0.05, factor=1.0, jitter=0.0, attempts=2)
    sink = RtmpSink(url, output.request_keyframe, backoff, io_timeout=1.0)
    output.add_sink(sink)
    output.start()
    assert output.finished.wait(20)
    output.stop()
    assert sink.gave_up and output.sinks == ()
    assert len(reported) == 1 and reported[0][0] == "rtmp"
    shown = url.rsplit("/", 1)[0] + "/***"
    assert reported[0][1].startswith(f"gave up on {shown} after 2 attempts: cannot publish to {shown}")
    assert "nobody" not in reported[0][1], "the stream key is never in a message a client or a log sees"


@pytest.mark.slow
def test_a_stream_arrives_whole_at_25_fps_with_audio_in_sync(nginx_rtmp) -> None:
    frames = 3 * FPS
    reader = LiveReader(nginx_rtmp.url(), last_index=frames - 1)
    time.sleep(0.3)
    output = SessionOutput(SyntheticSession(256, 256, frames=frames), encoder="x264")
    sink = RtmpSink(nginx_rtmp.url(), output.request_keyframe)
    output.add_sink(sink)
    output.start()
    assert output.finished.wait(30)
    output.stop()
    got = reader.join()
    assert got.indices == list(range(frames)), got.error
    assert got.size == (256, 256)
    times = [pts for pts, _, _ in got.video]
    assert all(abs(b - a - 1 / FPS) < 1e-3 for a, b in zip(times, times[1:])), "constant 25 fps"
    assert got.audio_codec == "aac" and got.audio_rate == 48_000
    assert got.audio_seconds() >= frames / FPS - 0.1
    errors = got.sync_errors()
    assert len(errors) == 3 and max(errors) <= ONE_FRAME
    assert sink.stats() | {"connected": 0} == {
        "frames_sent": frames,
        "frames_dropped": 0,
        "connections": 1,
        "reconnects": 0,
        "failed_attempts": 0,
        "connected": 0,
        "state": "connected",
        "error": None,
        "retry_in_s": None,
    }


@pytest.mark.slow
def test_a_session_s_broadcast_settings_reach_the_server(nginx_rtmp) -> None:
    settings = OutputSettings(preset="ultrafast", audio_channels=2)
    frames = 2 * FPS
    reader = LiveReader(nginx_rtmp.url(), last_index=frames - 1)
    time.sleep(0.3)
    session = SyntheticSession(320, 180, frames=frames)
    output = SessionOutput(session, encoder="x264", settings=settings.video(320, 180))
    output.add_sink(RtmpSink(nginx_rtmp.url(), output.request_keyframe, audio_channels=settings.audio_channels))
    output.start()
    assert output.finished.wait(30)
    output.stop()
    got = reader.join()
    assert got.indices == list(range(frames)), got.error
    assert (got.video_profile, got.audio_codec, got.audio_rate, got.audio_channels) == ("High", "aac", 48_000, 2)
    errors = got.sync_errors()
    assert len(errors) == 2 and max(errors) <= ONE_FRAME


@pytest.mark.slow
def test_a_server_restart_is_survived_in_order_and_in_sync(nginx_rtmp) -> None:
    frames = 8 * FPS
    first_reader = LiveReader(nginx_rtmp.url(), read_timeout=1.0)
    time.sleep(0.3)
    output = SessionOutput(SyntheticSession(256, 256, frames=frames), encoder="x264")
    sink = RtmpSink(nginx_rtmp.url(), output.request_keyframe, backoff=Backoff(first=0.5, attempts=6), seed=0)
    output.add_sink(sink)
    output.start()
    time.sleep(2.0)
    nginx_rtmp.stop()
    before = first_reader.join()
    nginx_rtmp.start()
    second_reader = LiveReader(nginx_rtmp.url(), last_index=frames - 1)
    assert output.finished.wait(30)
    output.stop()
    after = second_reader.join()

    assert before.indices[:3] == [0, 1, 2] and len(before.indices) >= FPS
    assert after.indices, after.error
    assert after.indices[0] > before.indices[-1], "the stream came back later in the session, not replayed"
    assert after.indices == list(range(after.indices[0], frames)), "in order, no gaps once reconnected"
    assert after.indices[-1] == frames - 1
    assert after.video[0][0] < 0.1, "the new connection's timeline starts at its first keyframe"
    errors = after.sync_errors()
    assert errors and max(errors) <= ONE_FRAME
    stats = sink.stats()
    assert stats["reconnects"] == 1 and stats["connections"] == 2
    assert (stats["state"], stats["error"]) == ("connected", None), "back, and no error shown once it is"
    assert stats["frames_dropped"] > 0 and stats["frames_sent"] + stats["frames_dropped"] == frames

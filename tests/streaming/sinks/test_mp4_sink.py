"""Recording a live session to MP4: the shared H.264 stream plus AAC 48 kHz, from a keyframe, gaps kept in time."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.timebase import FPS
from streaming.encoders.x264 import X264Encoder
from streaming.frames import AUDIO_SAMPLES_PER_FRAME
from streaming.output import EncodedFrame, SessionOutput
from streaming.sinks.mp4 import Mp4Sink
from streaming.sinks.mux import Muxer
from tests.streaming.media import ONE_FRAME, read_file
from tests.streaming.synthetic import SyntheticSession, picture, sound


def test_a_live_recording_has_every_frame_at_25_fps_with_audio_in_sync(tmp_path: Path) -> None:
    path = tmp_path / "live.mp4"
    output = SessionOutput(SyntheticSession(128, 128, frames=2 * FPS), encoder="x264")
    sink = Mp4Sink(path, output.request_keyframe)
    output.add_sink(sink)
    output.start()
    assert output.finished.wait(20)
    output.stop()
    got = read_file(str(path))
    assert got.indices == list(range(2 * FPS)) and got.size == (128, 128)
    assert [pts for pts, _, _ in got.video] == [i / FPS for i in range(2 * FPS)]
    assert got.audio_codec == "aac" and got.audio_rate == 48_000
    assert abs(got.audio_seconds() - 2.0) < 0.05
    errors = got.sync_errors()
    assert len(errors) == 2 and max(errors) <= ONE_FRAME
    assert sink.stats() == {"frames_sent": 2 * FPS, "frames_dropped": 0}


def test_a_sink_attached_mid_stream_starts_on_the_keyframe_it_asks_for(tmp_path: Path) -> None:
    path = tmp_path / "late.mp4"
    output = SessionOutput(SyntheticSession(64, 64, frames=60), encoder="x264")
    output.start()
    deadline = time.monotonic() + 10
    while output.stats.frames_released < 15:
        assert time.monotonic() < deadline, (
            f"only {output.stats.frames_released} of the first 15 frames released within 10 s"
        )
        time.sleep(0.01)
    sink = Mp4Sink(path, output.request_keyframe)
    output.add_sink(sink)
    assert output.finished.wait(20)
    output.stop()
    got = read_file(str(path))
    first = got.indices[0]
    assert 15 <= first < 30 and got.indices == list(range(first, 60))
    assert got.video[0][0] == 0.0, "the file's timeline starts at its first frame"
    assert sink.frames_sent == len(got.indices) and sink.frames_dropped >= 1, "frames before its keyframe are skipped"


def test_frames_lost_upstream_leave_a_gap_and_writing_resumes_at_a_keyframe(tmp_path: Path) -> None:
    encoder = X264Encoder(64, 64)
    path = tmp_path / "gap.mp4"
    muxer = Muxer(str(path), "mp4", 64, 64)
    written = []
    for i in range(12):
        if i == 8:
            encoder.keyframes.request()
        (unit,) = encoder.encode(picture(i, 64, 64), i)
        frame = EncodedFrame(i, 64, 64, unit.data, unit.keyframe, sound(i), (), False)
        if i in (3, 4):
            continue  # lost before the muxer
        written.append(muxer.write(frame))
    muxer.close()
    assert written == [True, True, True, False, False, False, True, True, True, True]
    got = read_file(str(path))
    assert got.indices == [0, 1, 2, 8, 9, 10, 11]
    assert [round(pts * FPS) for pts, _, _ in got.video] == [0, 1, 2, 8, 9, 10, 11]
    audio_end = max(start + block.size / 48_000 for start, block in got.audio)
    assert abs(audio_end - 12 * AUDIO_SAMPLES_PER_FRAME / 48_000) < 0.03, "audio keeps the gap too"
    starts = [start for start, _ in got.audio]
    assert not [t for t in starts if 0.15 < t < 0.3], "no audio where frames were lost"
    assert min(abs(t - 8 / FPS) for t in starts) < 0.001, "audio resumes exactly with the keyframe's frame"


def record(path: Path, frames: int = 10) -> tuple[Mp4Sink, list[tuple[str, str]], SessionOutput]:
    """Run a short synthetic session into an MP4 sink at ``path``; the sink, the failures the output reported, it."""
    reported: list[tuple[str, str]] = []
    session = SyntheticSession(64, 64, frames=frames)
    output = SessionOutput(session, encoder="x264", on_sink_failed=lambda *failure: reported.append(failure))
    sink = Mp4Sink(path, output.request_keyframe)
    output.add_sink(sink)
    output.start()
    assert output.finished.wait(20), "the output did not finish"
    output.stop()
    return sink, reported, output


def test_a_fifo_at_the_target_is_refused_and_reported_never_opened(tmp_path: Path) -> None:
    path = tmp_path / "fifo.mp4"
    os.mkfifo(path)
    sink, reported, output = record(path)
    assert reported == [("mp4", f"{path} exists; a recording never replaces anything")]
    assert sink.error == reported[0][1] and output.stats.frames_released == 10, "the output went on without it"
    assert stat.S_ISFIFO(path.lstat().st_mode)


def test_an_existing_file_is_neither_truncated_nor_replaced(tmp_path: Path) -> None:
    path = tmp_path / "kept.mp4"
    path.write_bytes(b"owned by someone else")
    _, reported, _ = record(path)
    assert reported == [("mp4", f"{path} exists; a recording never replaces anything")]
    assert path.read_bytes() == b"owned by someone else"


def test_a_link_at_the_target_is_not_followed(tmp_path: Path) -> None:
    victim, path = tmp_path / "victim", tmp_path / "link.mp4"
    victim.write_bytes(b"untouched")
    path.symlink_to(victim)
    _, reported, _ = record(path)
    assert reported and "exists" in reported[0][1]
    assert victim.read_bytes() == b"untouched" and path.is_symlink()


def test_a_name_that_looks_like_an_ffmpeg_url_is_only_a_file_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    name = "tee:a.mp4|b.mp4"
    sink, reported, _ = record(Path(name))
    assert reported == [] and sink.frames_sent == 10
    assert read_file(str(tmp_path / name)).indices == list(range(10))
    assert [p.name for p in tmp_path.iterdir()] == [name], "FFmpeg's tee protocol wrote nothing"


FULL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from streaming.output import SessionOutput
from streaming.sinks.mp4 import Mp4Sink
from tests.streaming.synthetic import SyntheticSession
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16_384, resource.RLIM_INFINITY))
reported = []
session = SyntheticSession(128, 128, frames=25)
output = SessionOutput(session, encoder="x264", on_sink_failed=lambda *failure: reported.append(failure))
output.add_sink(Mp4Sink(Path(sys.argv[1]), output.request_keyframe))
output.start()
assert output.finished.wait(30)
output.stop()
print(json.dumps({"reported": reported, "released": output.stats.frames_released}))
"""


@pytest.mark.slow
def test_a_full_disk_ends_the_recording_and_the_output_reports_it(tmp_path: Path) -> None:
    """A process whose files may not grow past 16 kB: its writes fail as they do on a full disk."""
    path = tmp_path / "full.mp4"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    command = [sys.executable, "-c", FULL_DISK, str(path)]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["reported"] == [["mp4", f"recording to {path} failed: File too large"]]
    assert result["released"] == 25, "the session's output went on"


def test_a_file_system_that_hangs_holds_up_no_other_output_and_is_reported(tmp_path: Path, monkeypatch) -> None:
    """A hung file system (an open that never returns) ends its session's output in time, reported, not silent."""
    hung = threading.Event()
    monkeypatch.setattr("streaming.sinks.mp4.create_recording", lambda path: hung.wait())
    other = SessionOutput(SyntheticSession(64, 64, frames=25), encoder="x264").start()
    reported: list[tuple[str, str]] = []
    session = SyntheticSession(64, 64, frames=10)
    output = SessionOutput(session, encoder="x264", on_sink_failed=lambda *failure: reported.append(failure))
    output.add_sink(Mp4Sink(tmp_path / "hung.mp4", output.request_keyframe, close_seconds=1.0))
    started = time.monotonic()
    output.start()
    try:
        assert other.finished.wait(5) and other.stats.frames_released == 25
        assert output.finished.wait(5), "closing waits close_seconds for the file, not for ever"
        assert time.monotonic() - started < 3.5
        assert output.stats.frames_released == 10
        why = f"recording to {tmp_path / 'hung.mp4'} was not finished within 1 s: its file system does not answer"
        assert reported == [("mp4", why)]
    finally:
        hung.set()
        output.stop()
        other.stop()

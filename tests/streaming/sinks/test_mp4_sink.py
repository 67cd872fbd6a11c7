"""Recording a live session to MP4: the shared H.264 stream plus AAC 48 kHz, from a keyframe, gaps kept in time."""

from __future__ import annotations

import time
from pathlib import Path

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
        assert time.monotonic() < deadline, f"only {output.stats.frames_released} of the first 15 frames released within 10 s"
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

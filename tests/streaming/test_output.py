"""A session output: every frame encoded once, released at its pts, to every sink, in order, with its own audio."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.timebase import FPS
from streaming.fanout import SinkFailed
from streaming.frames import AUDIO_SAMPLES_PER_FRAME, EncodedFrame
from streaming.output import SessionOutput
from tests.streaming.synthetic import SyntheticSession, sound


class Recorder:
    """A sink that keeps what it is sent and when."""

    name = "recorder"

    def __init__(self) -> None:
        self.frames: list[EncodedFrame] = []
        self.times: list[float] = []
        self.closed = False

    def send(self, frame: EncodedFrame) -> None:
        self.frames.append(frame)
        self.times.append(time.monotonic())

    def close(self) -> None:
        self.closed = True

    def stats(self) -> dict[str, int]:
        return {"frames_sent": len(self.frames)}


class Broken(Recorder):
    name = "broken"

    def send(self, frame: EncodedFrame) -> None:
        raise OSError("this sink is broken")


class Failing(Recorder):
    """A sink whose target fails after its first frames, as a full disk does, and says so."""

    name = "failing"

    def send(self, frame: EncodedFrame) -> None:
        if len(self.frames) == 3:
            raise SinkFailed("recording to /recordings/a.mp4 failed: No space left on device")
        super().send(frame)


class FailsAtClose(Recorder):
    name = "trailer"

    def close(self) -> None:
        super().close()
        raise SinkFailed("recording to /recordings/b.mp4 failed: No space left on device")


def run(frames: int, sinks: list, session: SyntheticSession | None = None, **kwargs) -> SessionOutput:
    """Stream ``session`` (a synthetic one of ``frames`` frames by default) through x264 to ``sinks`` until it ends."""
    output = SessionOutput(session or SyntheticSession(64, 64, frames=frames), encoder="x264", **kwargs)
    for sink in sinks:
        output.add_sink(sink)
    output.start()
    assert output.finished.wait(20), "the output did not finish after the session ended"
    output.stop()
    return output


def test_every_frame_goes_to_every_sink_once_in_order_with_its_audio() -> None:
    first, second = Recorder(), Recorder()
    output = run(30, [first, second, Broken()])
    for sink in (first, second):
        assert [f.index for f in sink.frames] == list(range(30))
        assert sink.closed
    frames = first.frames
    assert frames[0].keyframe and frames[0].video.startswith((b"\x00\x00\x00\x01", b"\x00\x00\x01"))
    assert all((f.width, f.height) == (64, 64) for f in frames)
    assert all((f.audio == sound(f.index)).all() for f in frames)
    assert [len(f.opus) for f in frames] == [2] * 30
    opus_pts = [pts for f in frames for pts, _ in f.opus]
    assert all(b - a == 960 for a, b in zip(opus_pts, opus_pts[1:])), "Opus times come from the sample count"
    assert output.stats.frames_in == output.stats.frames_released == 30
    assert output.encoder.name == "x264" and output.encode_ms(0.5) > 0
    assert output.sinks == (first, second), "the failing sink was detached, the others carried on"


def test_frames_are_released_at_their_pts_without_drift() -> None:
    sink = Recorder()
    run(40, [sink], playout_delay=0.1)
    offsets = [t - sink.times[0] - f.index / FPS for t, f in zip(sink.times, sink.frames)]
    assert max(abs(o) for o in offsets) < 0.03


def test_a_keyframe_request_is_honoured_within_the_lead() -> None:
    sink = Recorder()
    session = SyntheticSession(64, 64, frames=60, lead=0.2)
    output = SessionOutput(session, encoder="x264")
    output.add_sink(sink)
    output.start()
    deadline = time.monotonic() + 10
    while len(sink.frames) < 20:
        assert time.monotonic() < deadline, (
            f"only {len(sink.frames)} of the first 20 frames reached the sink within 10 s"
        )
        time.sleep(0.01)
    asked_at = sink.frames[-1].index
    output.request_keyframe()
    assert output.finished.wait(20)
    keyframes = [f.index for f in sink.frames if f.keyframe]
    assert keyframes[0] == 0 and len(keyframes) == 2
    assert 0 < keyframes[1] - asked_at <= (0.2 + 0.1) * FPS + 2


@pytest.mark.parametrize("frames", [1, 7])
def test_short_sessions_finish_cleanly(frames: int) -> None:
    sink = Recorder()
    run(frames, [sink])
    assert len(sink.frames) == frames and sink.closed
    assert sum(f.audio.size for f in sink.frames) == frames * AUDIO_SAMPLES_PER_FRAME


def test_the_encode_thread_confines_only_itself_to_one_torch_thread() -> None:
    import threading

    import torch

    from streaming.output import confine_torch_threads

    default, seen = torch.get_num_threads(), {}

    def encode_thread() -> None:
        confine_torch_threads()
        seen["encode"] = torch.get_num_threads()

    thread = threading.Thread(target=encode_thread)
    thread.start()
    thread.join()
    later = threading.Thread(target=lambda: seen.setdefault("later", torch.get_num_threads()))
    later.start()
    later.join()
    assert seen == {"encode": 1, "later": default} and torch.get_num_threads() == default


class Stalling(SyntheticSession):
    """A session whose frames 10..14 come 0.3 s late (a GPU hiccup), the rest on its clock."""

    def next_frame(self, timeout: float | None = None):
        frame = super().next_frame(timeout)
        if frame is not None and frame.index == 10:
            time.sleep(0.3)
        return frame


def test_a_stall_is_shed_with_repeats_and_silence_while_the_timeline_keeps_wall_time() -> None:
    sink = Recorder()
    output = run(50, [sink], Stalling(64, 64, frames=50, lead=0.1))
    indices = [f.index for f in sink.frames]
    assert indices == list(range(indices[0], indices[0] + len(indices))), "one frame per slot: no gap in the timeline"
    offsets = [t - sink.times[0] - (f.index - indices[0]) / FPS for t, f in zip(sink.times, sink.frames)]
    assert max(abs(o) for o in offsets) < 0.03, "timestamps advance with wall time through the stall"
    repeats = [f for f in sink.frames if f.repeat]
    assert output.stats.repeated == len(repeats) >= 4
    assert all(not f.audio.any() and not f.speech for f in repeats), "a stand-in carries silence"
    assert output.stats.frames_in == 50 and output.stats.skipped >= 1


class LateHops(SyntheticSession):
    """From frame 10 on, frames come in hops of five, each hop 15 ms after its first frame is due: a full GPU whose
    frames (staging included) land just past the output's slot."""

    def next_frame(self, timeout: float | None = None):
        if self.next_index >= 10:
            hop = self.next_index - self.next_index % 5
            self.lead = (self.next_index - hop) / FPS - 0.015
        return super().next_frame(timeout)


def test_frames_late_by_less_than_a_slot_cost_one_repeat_and_a_slot_of_latency_never_speech() -> None:
    sink = Recorder()
    output = run(60, [sink], LateHops(64, 64, frames=60, lead=0.1))
    shown = [next(i for i in range(60) if np.array_equal(f.audio, sound(i))) for f in sink.frames if not f.repeat]
    assert shown == list(range(60)), "every frame is shown, with its audio, none skipped"
    assert output.stats.repeated == 1 and output.stats.skipped == 0
    assert output.stats.added_slots == 1 and 40 <= output.snapshot()["added_latency_ms"] < 60, "a slot (and the start)"


class SlowStart(SyntheticSession):
    """A session whose first frame comes 0.1 s after it is due (a slow start), the rest well ahead of the clock; its
    frames are silence, or (``speaking``) speech."""

    def __init__(self, speaking: bool) -> None:
        super().__init__(64, 64, frames=75, lead=0.2)
        self.speaking = speaking

    def next_frame(self, timeout: float | None = None):
        frame = super().next_frame(timeout)
        if frame is not None:
            if frame.index == 0:
                time.sleep(0.1)
            frame.speech, frame.audio = self.speaking, sound(frame.index) if self.speaking else 0 * frame.audio
        return frame


@pytest.mark.parametrize("speaking", [False, True])
def test_latency_a_slow_start_added_is_given_back_by_skipping_silence_never_speech(monkeypatch, speaking) -> None:
    monkeypatch.setattr("streaming.output.RECLAIM_SECONDS", 0.6)
    sink = Recorder()
    output = run(75, [sink], SlowStart(speaking))
    indices = [f.index for f in sink.frames]
    assert indices == list(range(indices[0], indices[0] + len(indices))), "one frame per slot: no gap in the timeline"
    assert output.stats.repeated == 0
    if speaking:
        assert output.stats.reclaimed == output.stats.skipped == 0, "no speech is skipped to give latency back"
        assert output.snapshot()["added_latency_ms"] >= 100
    else:
        assert output.stats.reclaimed == output.stats.skipped == 2, "two whole slots of the 0.1 s given back"
        assert output.snapshot()["added_latency_ms"] < 40
    assert output.snapshot()["slack_ms"] > 100, "the frames came more than the lead early"


def test_a_sink_that_fails_is_detached_closed_and_reported_while_the_others_go_on() -> None:
    reported: list[tuple[str, str]] = []
    kept, failing, broken, trailer = Recorder(), Failing(), Broken(), FailsAtClose()
    output = run(10, [kept, failing, broken, trailer], on_sink_failed=lambda *failure: reported.append(failure))
    assert reported == [
        ("broken", "the broken output failed (OSError)"),
        ("failing", "recording to /recordings/a.mp4 failed: No space left on device"),
        ("trailer", "recording to /recordings/b.mp4 failed: No space left on device"),
    ]
    assert failing.closed and broken.closed and len(failing.frames) == 3
    assert [f.index for f in kept.frames] == list(range(10)) and output.sinks == (kept, trailer)

"""An audio file played into a session in real time: 200 ms pushes at absolute deadlines, then the end."""

from __future__ import annotations

import time
import wave
from pathlib import Path

import numpy as np

from streaming.sources.file import FileSource
from tests.streaming.synthetic import SyntheticSession


class TimedSession(SyntheticSession):
    def __init__(self) -> None:
        super().__init__(frames=0)
        self.times: list[float] = []

    def push_audio(self, pcm, sample_rate, channels=None, block=False) -> None:
        self.times.append(time.monotonic())
        super().push_audio(pcm, sample_rate, channels, block)


def write_wav(path: Path, seconds: float, rate: int = 16_000) -> np.ndarray:
    samples = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(seconds * rate)) / rate) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return samples


def test_a_file_is_pushed_in_real_time_then_the_session_ends(tmp_path: Path) -> None:
    samples = write_wav(tmp_path / "speech.wav", 0.7)
    session = TimedSession()
    source = FileSource.open(session, tmp_path / "speech.wav").start()
    source._thread.join(5)
    assert [p.shape[0] for p, _, _ in session.pushed] == [3200, 3200, 3200, 1600]
    assert all(rate == 16_000 for _, rate, _ in session.pushed)
    assert np.allclose(np.concatenate([p.reshape(-1) for p, _, _ in session.pushed]), samples / 32768, atol=1e-4)
    offsets = [t - session.times[0] - 0.2 * k for k, t in enumerate(session.times)]
    assert max(abs(o) for o in offsets) < 0.03, "chunk k goes at start + k * 200 ms"
    assert session.ended


def test_looping_starts_over_and_stop_does_not_end_the_session(tmp_path: Path) -> None:
    write_wav(tmp_path / "short.wav", 0.2)
    session = TimedSession()
    source = FileSource.open(session, tmp_path / "short.wav", loop=True).start()
    time.sleep(0.75)
    source.stop()
    assert len(session.pushed) >= 4 and not session.ended

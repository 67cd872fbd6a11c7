"""python -m engine.render: the demo writes an MP4 whose audio and video end together."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from engine.render.__main__ import main

pytestmark = pytest.mark.slow


def test_the_demo_renders_an_mp4_with_synchronised_audio(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DITTO_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "demo.mp4"
    assert main(["--demo", "--device", "cpu", "--steps", "2", "--max-seconds", "0.12", "--out", str(out)]) == 0
    assert "RANDOM WEIGHTS" in capsys.readouterr().err
    with av.open(str(out)) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        frames = list(container.decode(video))
        assert len(frames) == 3
        assert frames[0].pts * video.time_base == 0
        video_end = float(video.duration * video.time_base)
        audio_end = float(audio.duration * audio.time_base)
    assert video_end == pytest.approx(0.12, abs=1e-3)
    assert audio_end == pytest.approx(video_end, abs=0.07)


def test_missing_arguments_are_explained(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--audio", "x.wav"])
    assert "--avatar and --audio are required" in capsys.readouterr().err

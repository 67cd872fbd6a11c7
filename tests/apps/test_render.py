"""python -m apps.render: the demo writes an MP4 whose audio and video end together, in either mode."""

from __future__ import annotations

import io
from pathlib import Path

import av
import pytest
from tqdm import tqdm

from apps.render import main, next_frame_ticking


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of random weights for the module's renders (writing them takes seconds)."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.slow
def test_the_demo_renders_an_mp4_with_synchronised_audio(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DITTO_CACHE_DIR", str(cache))
    out = tmp_path / "demo.mp4"
    assert main(["--demo", "--device", "cpu", "--steps", "2", "--max-seconds", "0.12", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "RANDOM WEIGHTS" in err
    assert "3 frames" in err and "(offline mode, overlap 10)" in err, "the reference's offline mode is the default"
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


@pytest.mark.slow
def test_online_mode_previews_the_live_algorithm(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DITTO_CACHE_DIR", str(cache))
    out = tmp_path / "online.mp4"
    argv = ["--demo", "--device", "cpu", "--steps", "2", "--max-seconds", "0.04", "--mode", "online", "--out", str(out)]
    assert main(argv) == 0
    assert "(online mode, overlap 75)" in capsys.readouterr().err
    with av.open(str(out)) as container:
        assert len(list(container.decode(container.streams.video[0]))) == 1


@pytest.mark.parametrize("overlap", ["80", "-1"])
def test_an_overlap_outside_the_window_is_explained(overlap: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--demo", "--overlap", overlap])
    assert "--overlap must be in [0, 80)" in capsys.readouterr().err


def test_the_progress_bar_ticks_while_a_batch_of_frames_renders() -> None:
    """Issue 38: the CPU demo's bar sat at 0/10 for minutes (its frames come in one batch); its clock now ticks."""

    class Batch:
        waits = 0

        def next_frame(self, timeout: float | None = None) -> str:
            self.waits += 1
            if self.waits < 4:
                raise TimeoutError
            return "frame"

    shown = io.StringIO()
    with tqdm(total=10, file=shown) as bar:
        assert next_frame_ticking(Batch(), bar, tick=0.0) == "frame"
    assert shown.getvalue().count("0/10") >= 4 and "rendering a batch of frames" in shown.getvalue()

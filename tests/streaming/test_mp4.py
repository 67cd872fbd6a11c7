"""MP4 writer: H.264 + AAC (48 kHz) at 25 fps, exact frame times, audio and video ending together."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from streaming.mp4 import AAC_FRAME, AUDIO_RATE, Mp4Writer

W, H = 64, 48


def colour(i: int) -> np.ndarray:
    """A flat frame whose colour names its index."""
    return np.broadcast_to(np.array([40 + 3 * i, 200 - 2 * i, 120], np.uint8), (H, W, 3)).copy()


def stream_seconds(path: Path) -> dict[str, float]:
    """Duration of each stream as the container records it."""
    with av.open(str(path)) as container:
        return {s.type: float(s.duration * s.time_base) for s in container.streams}


def decoded_video(path: Path) -> list[tuple[Fraction, np.ndarray]]:
    """(presentation time, RGB) of every decoded frame."""
    with av.open(str(path)) as container:
        return [(f.pts * f.time_base, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]


def test_two_seconds_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "two.mp4"
    audio = (0.3 * np.sin(2 * np.pi * 220 * np.arange(2 * AUDIO_RATE) / AUDIO_RATE)).astype(np.float32)
    rng = np.random.default_rng(0)
    with Mp4Writer(path, W, H) as writer:
        cut = 0
        for i in range(50):  # audio arrives in uneven pieces interleaved with the frames
            step = int(rng.integers(0, 1500))
            writer.write_audio(audio[cut : cut + step])
            cut += step
            writer.write_frame(colour(i))
        writer.write_audio(audio[cut:])
    frames = decoded_video(path)
    assert len(frames) == 50
    assert [t for t, _ in frames] == [Fraction(i, 25) for i in range(50)]
    for i, (_, rgb) in enumerate(frames):
        assert np.abs(rgb.astype(int) - colour(i)).mean() < 4
    seconds = stream_seconds(path)
    assert seconds["video"] == pytest.approx(2.0)
    assert abs(seconds["audio"] - seconds["video"]) <= AAC_FRAME / AUDIO_RATE
    with av.open(str(path)) as container:
        first_audio = next(container.decode(audio=0))
        assert container.streams.audio[0].codec_context.name == "aac"
        assert container.streams.audio[0].sample_rate == AUDIO_RATE
        assert container.streams.video[0].codec_context.name == "h264"
    assert first_audio.pts == 0


@pytest.mark.parametrize("audio_seconds", [0.0, 0.1, 3.0])
def test_close_fits_the_audio_to_the_video(tmp_path: Path, audio_seconds: float) -> None:
    path = tmp_path / "fit.mp4"
    with Mp4Writer(path, W, H) as writer:
        writer.write_audio(np.full(int(audio_seconds * AUDIO_RATE), 0.1, np.float32))
        writer.write_frames(np.stack([colour(i) for i in range(10)]))
    seconds = stream_seconds(path)
    assert seconds["video"] == pytest.approx(0.4)
    assert abs(seconds["audio"] - 0.4) <= AAC_FRAME / AUDIO_RATE


def test_torch_frames_and_double_close(tmp_path: Path) -> None:
    path = tmp_path / "torch.mp4"
    writer = Mp4Writer(path, W, H)
    writer.write_frames(torch.from_numpy(np.stack([colour(0), colour(1)])))
    writer.write_frame(torch.from_numpy(colour(2)))
    writer.close()
    writer.close()
    assert writer.duration == pytest.approx(3 / 25)
    assert len(decoded_video(path)) == 3
    with pytest.raises(RuntimeError, match="closed"):
        writer.write_frame(colour(3))


def test_bad_inputs_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="even"):
        Mp4Writer(tmp_path / "odd.mp4", 63, 48)
    with Mp4Writer(tmp_path / "bad.mp4", W, H) as writer:
        with pytest.raises(ValueError, match=r"\(48, 64, 3\) uint8"):
            writer.write_frame(np.zeros((H, W, 3), np.float32))
        with pytest.raises(ValueError, match=r"\(48, 64, 3\) uint8"):
            writer.write_frame(np.zeros((3, H, W), np.uint8))
        with pytest.raises(ValueError, match=r"\(B, 48, 64, 3\)"):
            writer.write_frames(np.zeros((H, W, 3), np.uint8))
        with pytest.raises(TypeError, match="48000 Hz"):
            writer.write_audio(np.zeros(100, np.int16))


@pytest.mark.parametrize("order", ["audio_first", "video_first", "per_frame"])
def test_a_short_file_reads_25_fps_whatever_reaches_the_muxer_first(tmp_path: Path, order: str) -> None:
    """10 frames and 0.41 s of audio (a CPU demo render): 25 fps on average, 10 frames, 0.4 s, each frame 1/25 s;
    several runs."""
    audio = (0.3 * np.sin(np.arange(int(0.41 * AUDIO_RATE)) / 10)).astype(np.float32)
    frames = np.stack([colour(i) for i in range(10)])
    for run in range(3):
        path = tmp_path / f"{order}-{run}.mp4"
        with Mp4Writer(path, W, H) as writer:
            if order == "audio_first":
                writer.write_audio(audio)
                writer.write_frames(frames)
            elif order == "video_first":
                writer.write_frames(frames)
                writer.write_audio(audio)
            else:
                for i, frame in enumerate(frames):
                    writer.write_frames(frame[None])
                    writer.write_audio(audio[i * 1920 : (i + 1) * 1920])
        with av.open(str(path)) as container:
            video = container.streams.video[0]
            assert video.average_rate == 25 and video.frames == 10, (video.average_rate, video.frames)
            assert float(video.duration * video.time_base) == pytest.approx(0.4, abs=1e-3)
            durations = [p.duration * p.time_base for p in container.demux(video=0) if p.size]
            assert durations == [Fraction(1, 25)] * 10
        assert stream_seconds(path)["audio"] == pytest.approx(0.4, abs=0.03)

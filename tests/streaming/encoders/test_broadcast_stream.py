"""A broadcast anchor's stream as an RTMP server receives it: 1080p High at a constant bitrate, 2 s closed GOPs, AAC.

Ten seconds of moving 1080p pictures go through the x264 encoder with a session's output settings and the FLV muxer
(what the RTMP sink sends), and the file is read back with PyAV as an ingest server would see it.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from engine.timebase import FPS
from streaming.encoders.x264 import X264Encoder
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from streaming.output import EncodedFrame
from streaming.output_settings import OutputSettings
from streaming.sinks.mux import Muxer

SECONDS = 10
W, H = 1920, 1080


def moving_pictures(width: int, height: int, frames: int):
    """I420 pictures with detail that moves every frame: a sliding grain texture, a ramp and a bar."""
    rng = np.random.default_rng(0)
    grain = rng.integers(0, 48, (height, width), dtype=np.uint8)
    ramp = np.linspace(16, 180, width).astype(np.uint8)
    picture = np.empty((height * 3 // 2, width), np.uint8)
    for i in range(frames):
        picture[:height] = np.roll(ramp, i * 8)[None, :] + np.roll(grain, i * 5, axis=1)
        picture[height:] = (128 + 40 * np.sin(i / 10)).astype(np.uint8)
        top = i * 7 % (height - 64)
        picture[top : top + 64] = 235
        yield picture.copy()


def tone(index: int) -> np.ndarray:
    """Frame ``index``'s 1920 samples of a 440 Hz tone."""
    t = (index * AUDIO_SAMPLES_PER_FRAME + np.arange(AUDIO_SAMPLES_PER_FRAME)) / AUDIO_RATE
    return (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OutputSettings]:
    settings = OutputSettings(size="1080p", preset="ultrafast", audio_channels=2)
    width, height = settings.frame_size(W, H)
    encoder = X264Encoder(width, height, settings.video(W, H))
    path = tmp_path_factory.mktemp("broadcast") / "anchor.flv"
    muxer = Muxer(str(path), "flv", width, height, settings.audio_channels)
    for i, picture in enumerate(moving_pictures(width, height, SECONDS * FPS)):
        for unit in encoder.encode_picture(picture, i):
            muxer.write(EncodedFrame(unit.index, width, height, unit.data, unit.keyframe, tone(unit.index), (), True))
    muxer.close()
    return path, settings


def test_the_stream_is_1080p_high_at_level_4(stream: tuple[Path, OutputSettings]) -> None:
    path, _ = stream
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        assert (video.codec_context.width, video.codec_context.height) == (1920, 1080)
        assert video.codec_context.profile == "High"
        first = next(container.demux(video))
        decoder = av.CodecContext.create("h264", "r")
        decoder.extradata = video.codec_context.extradata
        decoder.decode(first)
        assert decoder.level == 40


def test_keyframes_come_exactly_every_two_seconds(stream: tuple[Path, OutputSettings]) -> None:
    path, _ = stream
    with av.open(str(path)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
    keys = [i for i, packet in enumerate(packets) if packet.is_keyframe]
    assert keys == list(range(0, SECONDS * FPS, 2 * FPS))


def test_the_video_bitrate_holds_the_target_within_ten_percent(stream: tuple[Path, OutputSettings]) -> None:
    path, settings = stream
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        sizes = [p.size for p in container.demux(video) if p.size]
    assert len(sizes) == SECONDS * FPS
    kbps = sum(sizes) * 8 / SECONDS / 1000
    target = settings.video(W, H).bitrate / 1000
    assert target == 6000
    assert abs(kbps - target) <= 0.1 * target, f"{kbps:.0f} kbit/s for a {target:.0f} kbit/s CBR target"


def test_the_audio_is_aac_48khz_with_the_configured_channels(stream: tuple[Path, OutputSettings]) -> None:
    path, settings = stream
    with av.open(str(path)) as container:
        audio = container.streams.audio[0]
        assert audio.codec_context.name == "aac"
        assert audio.codec_context.sample_rate == AUDIO_RATE
        assert audio.codec_context.channels == settings.audio_channels == 2
        frames = list(container.decode(audio))
    samples = sum(f.samples for f in frames)
    assert abs(samples - SECONDS * AUDIO_RATE) <= 2048
    left, right = frames[10].to_ndarray()
    assert np.allclose(left, right) and np.abs(left).max() > 0.1, "the voice in both channels"

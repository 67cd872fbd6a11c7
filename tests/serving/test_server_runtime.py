"""End to end on the CPU: the server over the real runtime and networks (random weights) speaks a file into RTMP and
MP4.

The RTMP sink's own stream is checked frame by frame in tests/streaming/sinks; here the recorded MP4 shows what the
runtime made of the file, and the run shows the RTMP sink did not get in the way of ending.
"""

from __future__ import annotations

import asyncio
import math
import wave

import av
import numpy as np
import pytest
from PIL import Image

import serving.server as server_module
from apps.serve import parse_args, server_options
from avatars.register import register
from tests.streaming.conftest import free_port

pytestmark = pytest.mark.slow


def write_wav(path, seconds: float, rate: int = 24_000) -> int:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.4 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return pcm.size


def test_a_spoken_file_reaches_rtmp_and_mp4_with_its_audio(tmp_path, checkpoint_dir, nginx_rtmp) -> None:
    from skimage import data

    Image.fromarray(data.astronaut()[:320, 64:384]).save(tmp_path / "face.png")
    avatar = register(tmp_path / "face.png", "face", checkpoint_dir(), cache_dir=tmp_path, progress=False)
    samples = write_wav(tmp_path / "speech.wav", 0.12)
    out = tmp_path / "live.mp4"
    args = parse_args(
        [
            "--avatar",
            str(avatar),
            "--audio",
            str(tmp_path / "speech.wav"),
            "--mp4",
            str(out),
            "--rtmp",
            nginx_rtmp.url("e2e"),
        ]
        + ["--encoder", "x264", "--device", "cpu", "--steps", "2", "--http", f"127.0.0.1:{free_port()}"]
    )
    assert asyncio.run(asyncio.wait_for(server_module.serve(server_options(args)), 900)) == 0
    with av.open(str(out)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0]
        assert (video.width, video.height) == (320, 320) and audio.rate == 48_000
        frames = sum(1 for _ in container.decode(video=0))
    assert frames >= math.ceil(samples / 24_000 * 25)

"""Session: audio in at any rate, full frames out on one audio clock, rendered by the real networks (CPU, random weights)."""

from __future__ import annotations

import asyncio
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image

from avatars.cache import load_avatar
from avatars.register import register
from engine.audio.hubert import TorchHubertRunner
from engine.audio.pcm import to_mono_16k
from engine.audio.standin_hubert import build_standin
from engine.backends.torch_backend import TorchBackend
from engine.engine import Engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(checkpoint_dir) -> Engine:
    backend = TorchBackend(checkpoint_dir(), device="cpu")
    return Engine(backend, TorchHubertRunner(build_standin()), steps=2, use_graphs=False)


@pytest.fixture(scope="module")
def avatar(checkpoint_dir, tmp_path_factory):
    from skimage import data

    folder = tmp_path_factory.mktemp("avatar")
    Image.fromarray(data.astronaut()).save(folder / "astronaut.png")
    cache = register(folder / "astronaut.png", "astronaut", checkpoint_dir(), cache_dir=folder, progress=False)
    return load_avatar(cache, "cpu")


def stereo_44k(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 44_100)) / 44_100
    left = 0.4 * np.sin(2 * np.pi * 220 * t)
    return np.stack([left, 0.5 * left], axis=1).astype(np.float32)


def test_frames_follow_the_audio_clock_and_carry_their_audio(engine: Engine, avatar) -> None:
    audio = stereo_44k(0.19)
    session = engine.session(avatar, overlap=75)
    session.push_audio(audio[:3000], 44_100, channels=2)
    session.push_audio(audio[3000:], 44_100, channels=2)
    session.end()
    frames = session.take_all()
    mono = to_mono_16k(audio, 44_100, channels=2)
    assert len(frames) == math.ceil(mono.size / 640) == 5
    assert [f.index for f in frames] == list(range(5))
    assert [f.pts for f in frames] == [Fraction(i, 25) for i in range(5)]
    height, width = avatar.frames.shape[1:3]
    for frame in frames:
        assert frame.image.shape == (height, width, 3) and frame.image.dtype == torch.uint8
    spoken = np.concatenate([f.audio for f in frames])
    assert spoken.size == 5 * 640
    np.testing.assert_allclose(spoken[: mono.size], mono, atol=1e-6)
    assert not spoken[mono.size :].any()
    assert not torch.equal(frames[0].image, avatar.frames[0]), "the rendered face must be pasted into the frame"


def test_the_async_iterator_ends_with_the_stream(engine: Engine, avatar) -> None:
    session = engine.session(avatar, overlap=75)

    async def collect() -> list[int]:
        session.push_audio(np.zeros(1280, np.float32), 16_000)
        session.end()
        return [frame.index async for frame in session.frames()]

    assert asyncio.run(collect()) == [0, 1]


def test_pushing_after_the_end_is_refused(engine: Engine, avatar) -> None:
    session = engine.session(avatar, overlap=75)
    session.end()
    with pytest.raises(RuntimeError, match="ended"):
        session.push_audio(np.zeros(100, np.float32), 16_000)
    assert session.take_all() == []


def test_a_live_session_idles_on_silence_when_no_audio_comes(engine: Engine, avatar) -> None:
    session = engine.session(avatar, overlap=75)

    async def wait_without_audio() -> None:
        frames = session.frames(live=True, poll=0.01)
        task = asyncio.ensure_future(frames.__anext__())
        await asyncio.sleep(0.3)
        task.cancel()

    asyncio.run(wait_without_audio())
    assert session.motion.samples_in in (3200, 6400), "one 200 ms hop of silence per hop of wall time"


def test_interrupt_drops_speech_that_has_not_become_motion(engine: Engine, avatar) -> None:
    session = engine.session(avatar, overlap=75)
    session.push_audio(np.full(4000, 0.2, np.float32), 16_000)  # short of the first hop's look-ahead
    assert session.motion.samples_in == 4000
    session.interrupt()
    assert session.motion.samples_in == 0
    session.end()
    assert session.take_all() == []

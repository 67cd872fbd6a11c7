"""The runtime on the CPU with the real networks (random weights, 2 DDIM steps): independence, audio, bounds, interrupt.

Rendering a 512x512 frame takes about 9 s on two AVX2 cores, so each test renders few frames.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest
import soxr
import torch
from PIL import Image

from avatars.cache import load_avatar
from avatars.register import register
from engine.audio.hubert import TorchHubertRunner, offline_frame_count
from engine.audio.standin_hubert import build_standin
from engine.backends.torch_backend import TorchBackend
from engine.controls import ControlError, Controls
from engine.engine import Engine
from engine.runtime import AdmissionError, AudioError, Backpressure, Runtime, RuntimeConfig, SessionClosed

pytestmark = pytest.mark.slow
RATE = 44_100


@pytest.fixture(scope="module")
def runtime(checkpoint_dir):
    engine = Engine(TorchBackend(checkpoint_dir(), device="cpu"), TorchHubertRunner(build_standin()), steps=2)
    config = RuntimeConfig(progress=False, render_frames_per_tick=3, max_queued_frames=10, max_lead_seconds=2.0)
    with Runtime(engine, config) as rt:
        yield rt


@pytest.fixture(scope="module")
def avatar(checkpoint_dir, tmp_path_factory):
    from skimage import data

    folder = tmp_path_factory.mktemp("avatar")
    Image.fromarray(data.astronaut()).save(folder / "astronaut.png")
    cache = register(folder / "astronaut.png", "astronaut", checkpoint_dir(), cache_dir=folder, progress=False)
    return load_avatar(cache, "cpu")


def tone(seconds: float, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.4 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def render_offline(runtime: Runtime, avatar, seeds: list[int], audio: np.ndarray) -> list[list]:
    sessions = [runtime.open_session(avatar, live=False, overlap=75, seed=s) for s in seeds]
    assert len(runtime.avatars) == 1
    for session in sessions:
        session.push_audio(audio[:1500], RATE)
        session.push_audio(audio[1500:], RATE)
        session.end()
    frames: list[list] = [[] for _ in sessions]
    while any(not s.finished for s in sessions):
        for i, session in enumerate(sessions):
            frames[i].extend(session.take_ready())
        time.sleep(0.05)
    return frames


def test_a_session_beside_another_makes_exactly_the_frames_it_makes_alone_with_its_own_48k_audio(
    runtime: Runtime, avatar
) -> None:
    audio = tone(0.07)
    alone = render_offline(runtime, avatar, [1], audio)[0]
    together, beside = render_offline(runtime, avatar, [1, 0], audio)
    assert len(alone) == math.ceil(soxr.resample(audio, RATE, 16_000).size / 640) == 2
    assert [f.index for f in together] == [f.index for f in alone] == [f.index for f in beside] == list(range(2))
    assert all(torch.equal(a.image, b.image) for a, b in zip(together, alone)), "the same frames beside another"
    assert not all(torch.equal(a.image, b.image) for a, b in zip(together, beside)), "the other is another session"
    assert len(runtime.avatars) == 0
    metrics = runtime.metrics()
    assert 0 < metrics["tick_cpu_ms_p50"] and metrics["tick_cpu_ms_p99"] <= metrics["tick_wall_ms_p99"] + 1, (
        "the loop's CPU share of its ticks"
    )
    frames = alone
    assert [f.pts for f in frames] == [Fraction(i, 25) for i in range(2)]
    assert all(f.audio.shape == (1920,) and f.audio.dtype == np.float32 and f.speech for f in frames)
    expected = soxr.resample(audio, RATE, 48_000, quality="HQ")
    got = np.concatenate([f.audio for f in frames])
    np.testing.assert_allclose(got[: expected.size], expected, atol=1e-6)
    assert not got[expected.size :].any()
    height, width = avatar.frames.shape[1:3]
    assert all(f.image.shape == (height, width, 3) and f.image.dtype == torch.uint8 for f in frames)


def test_a_session_fed_offline_motion_renders_exactly_those_frames_with_their_audio(runtime: Runtime, avatar) -> None:
    audio = tone(0.08)
    samples = soxr.resample(audio, RATE, 16_000, quality="HQ")
    motion = runtime.offline_motion(avatar, samples, overlap=10, seed=3)
    assert motion.shape == (offline_frame_count(samples.size), 265) == (2, 265)
    assert torch.equal(runtime.offline_motion(avatar, samples, overlap=10, seed=3), motion), "seeded"
    with pytest.raises(ValueError, match="cannot be live"):
        runtime.open_session(avatar, live=True, motion=motion)
    session = runtime.open_session(avatar, live=False, motion=motion)
    session.push_audio(audio, RATE)
    session.end()
    frames = list(iter(lambda: session.next_frame(timeout=300), None))
    assert [f.index for f in frames] == [0, 1]
    assert torch.equal(torch.stack([f.motion for f in frames]), motion), "the precomputed motion, frame for frame"
    expected = soxr.resample(audio, RATE, 48_000, quality="HQ")
    got = np.concatenate([f.audio for f in frames])
    np.testing.assert_allclose(got[: expected.size], expected, atol=1e-6)
    assert len(runtime.avatars) == 0


def test_bad_audio_is_refused_with_a_clear_error_and_the_session_goes_on(runtime: Runtime, avatar) -> None:
    session = runtime.open_session(avatar, live=False)
    bad = tone(0.1)
    bad[7] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        session.push_audio(bad, RATE)
    with pytest.raises(AudioError, match="outside"):
        session.push_audio(tone(0.1), 5)
    with pytest.raises(AudioError, match="dtype"):
        session.push_audio(np.zeros(100, np.uint8), RATE)
    session.push_audio(tone(1.5), RATE)
    with pytest.raises(Backpressure, match="limit 2.0 s"):
        session.push_audio(tone(1.0), RATE)
    session.close()
    with pytest.raises(SessionClosed):
        session.push_audio(tone(0.1), RATE)
    assert session.next_frame(timeout=5) is None


def test_admission_refuses_a_live_session_the_gpu_could_not_serve(runtime: Runtime, avatar, monkeypatch) -> None:
    monkeypatch.setattr(runtime, "window_ms", {1: 150.0})
    monkeypatch.setattr(runtime, "render_ms", {5: 150.0})
    monkeypatch.setattr(runtime, "enforce_admission", True)
    assert runtime.capacity() == 0
    with pytest.raises(AdmissionError, match="at most 0 live session"):
        runtime.open_session(avatar, live=True)
    runtime.open_session(avatar, live=False).close()


def test_a_runtime_for_files_refuses_live_sessions_and_renders_files(runtime: Runtime, avatar) -> None:
    files_only = Runtime(runtime.engine, RuntimeConfig(progress=False, live=False))
    try:
        with pytest.raises(ValueError, match="renders files only"):
            files_only.open_session(avatar, live=True)
        session = files_only.open_session(avatar, live=False)
        session.push_audio(tone(0.04), RATE)
        session.end()
        assert [f.index for f in iter(lambda: session.next_frame(timeout=300), None)] == [0]
    finally:
        files_only.close()


def test_interrupt_drops_untaken_frames_and_goes_on_silently_numbered_from_the_last_frame_shown(
    runtime: Runtime, avatar
) -> None:
    session = runtime.open_session(avatar, live=True, overlap=75)
    session.push_audio(tone(0.2), RATE)
    shown = [session.next_frame(timeout=300) for _ in range(3)]
    assert [f.index for f in shown] == [0, 1, 2]
    session.interrupt()
    after = [session.next_frame(timeout=300) for _ in range(2)]
    session.close()
    assert [f.index for f in after] == [3, 4], "numbered on from the last frame shown"
    assert not any(f.speech for f in after) and not any(f.audio.any() for f in after)
    assert session.stats()["interrupts"] == 1


def test_controls_reach_the_rendered_frames_whether_opened_with_or_set_from_another_thread(
    runtime: Runtime, avatar
) -> None:
    turned = Controls(yaw=25.0, vad_alpha=0.0)
    plain = runtime.open_session(avatar, live=False, seed=3)
    opened = runtime.open_session(avatar, live=False, seed=3, controls=turned)
    updated = runtime.open_session(avatar, live=False, seed=3)
    assert plain.controls == runtime.default_controls == Controls()
    assert updated.update_controls(yaw=25.0, vad_alpha=0.0) == turned
    with pytest.raises(ControlError, match="yaw must be within"):
        updated.update_controls(yaw=-300)
    with pytest.raises(TypeError, match="Controls"):
        runtime.open_session(avatar, live=False, controls={"yaw": 25})
    images = []
    for session in (plain, opened, updated):
        session.push_audio(tone(0.03), RATE)
        session.end()
        frames = [session.next_frame(timeout=300)]
        assert session.next_frame(timeout=300) is None
        images.append(frames[0].image)
    assert torch.equal(images[1], images[2]), (
        "a change made before the loop's next tick is in force for every frame after it"
    )
    assert (images[0].float() - images[1].float()).abs().mean() > 1.0

"""MotionStream: every real audio frame becomes exactly one motion frame, however the audio arrives.

The stream is driven here the way the runtime drives it for one session: its chunks encoded,
its window requests sampled, one at a time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.audio.hubert import TorchHubertRunner, encode_chunks
from engine.audio.standin_hubert import build_standin
from engine.backends.torch_backend import TorchBackend
from engine.engine import Engine
from engine.motion.conditions import ConditionBuilder
from engine.motion_stream import MotionStream
from engine.runtime.pacing import speech_depth

SR = 16_000


@pytest.fixture(scope="module")
def engine(checkpoint_dir) -> Engine:
    backend = TorchBackend(checkpoint_dir("lmdm", "stitch_network"), device="cpu", networks=("lmdm", "stitch_network"))
    return Engine(backend, TorchHubertRunner(build_standin()), steps=2)


class Driven:
    """A MotionStream with the runtime's steps for one session: push, then everything that can run now."""

    def __init__(self, engine: Engine, overlap: int) -> None:
        g = torch.Generator().manual_seed(1)
        conditions = ConditionBuilder(
            torch.randn(63, generator=g) * 0.3, torch.rand(2, generator=g), torch.randn(6, generator=g) * 0.01, 1103
        )
        source = torch.randn(265, generator=g) * 0.5
        self.engine = engine
        self.sampler = engine.sampler()
        self.stream = MotionStream(conditions, source, engine.silence_feature, overlap, engine.step_noise(0))

    def push(self, samples: np.ndarray) -> torch.Tensor:
        self.stream.push(samples)
        return self.run()

    def end(self) -> torch.Tensor:
        self.stream.end()
        return self.run()

    def run(self) -> torch.Tensor:
        parts = []
        while True:
            chunks, keep = self.stream.take_chunks(8)
            self.stream.add_features(encode_chunks(self.engine.hubert, chunks)[:keep])
            request = self.stream.window_request()
            if request is None:
                break
            window = self.sampler(
                request.noise[None], request.cond_frame[None], request.cond[None], request.step_noise[:, None]
            )
            parts.append(self.stream.complete(window[0]))
        if self.stream.can_finish:
            parts.append(self.stream.finish())
        return torch.cat(parts) if parts else torch.zeros(0, 265)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def make_stream(engine: Engine, overlap: int) -> Driven:
    return Driven(engine, overlap)


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    return (
        0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.standard_normal(t.size)
    ).astype(np.float32)


@pytest.mark.parametrize("overlap", [75, 10])
def test_every_audio_frame_becomes_one_motion_frame(engine: Engine, overlap: int) -> None:
    audio = speech(1.3)
    stream = make_stream(engine, overlap)
    motion = torch.cat([stream.push(audio), stream.end()])
    assert motion.shape == (math.ceil(audio.size / 640), 265)
    assert torch.isfinite(motion).all()
    assert stream.frames_out == motion.shape[0]


def test_uneven_pushes_give_the_same_motion_as_one_push(engine: Engine) -> None:
    audio = speech(1.0, seed=2)
    whole = make_stream(engine, 75)
    expected = torch.cat([whole.push(audio), whole.end()])
    pieces = make_stream(engine, 75)
    cuts = [0, 1, 17, 3200, 3201, 7000, 12345, audio.size]
    got = torch.cat([pieces.push(audio[a:b]) for a, b in zip(cuts, cuts[1:])] + [pieces.end()])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_live_hop_yields_the_previous_hops_frames(engine: Engine) -> None:
    stream = make_stream(engine, 75)
    hop = 3200
    audio = speech(1.2, seed=3)
    counts = [stream.push(audio[i : i + hop]).shape[0] for i in range(0, audio.size, hop)]
    assert counts[:2] == [0, 0]
    assert set(counts[2:]) == {5}


@pytest.mark.parametrize("overlap", [75, 10])
def test_the_stream_says_exactly_how_much_audio_makes_the_next_frames_final(engine: Engine, overlap: int) -> None:
    stream = make_stream(engine, overlap)
    audio = speech(10.0)
    pushed = 0

    def push(samples: np.ndarray) -> None:
        stream.push(samples)
        while stream.audio_pending:
            stream.run()

    for total in [1, stream.frames_out + 1, 2 * (80 - overlap) + 3]:
        total = max(total, stream.frames_out + 1)
        needed = stream.samples_for_frames(total)
        assert needed > 0
        push(audio[pushed : pushed + needed - 1])
        assert stream.frames_out < total, "one sample less is not enough"
        push(audio[pushed + needed - 1 : pushed + needed])
        pushed += needed
        assert stream.frames_out >= total and stream.samples_for_frames(total) == 0


@pytest.mark.parametrize("overlap", [75, 10, 77])
def test_no_frame_needs_more_audio_after_it_than_the_speech_depth(engine: Engine, overlap: int) -> None:
    stream = make_stream(engine, overlap)
    windows = stream.windows
    after = [stream.samples_for_frames(f + 1) / 640 - f for f in range(3 * windows.valid + 7)]
    assert max(after) == speech_depth(windows.valid, windows.fuse)


def test_silence_keeps_the_stream_alive(engine: Engine) -> None:
    stream = make_stream(engine, 75)
    motion = torch.cat([stream.push(np.zeros(SR, np.float32)), stream.end()])
    assert motion.shape == (25, 265)
    assert motion[:, 202:].std(dim=0).mean() > 0


def test_interrupt_drops_audio_no_window_has_used(engine: Engine) -> None:
    stream = make_stream(engine, 75)
    first = stream.push(speech(1.0))
    used = stream.windows.windows_done * stream.windows.valid
    stream.stream.push(speech(0.1, seed=5)[:1000])
    stream.interrupt()
    rest = stream.end()
    assert first.shape[0] + rest.shape[0] == used
    assert stream.samples_in == used * 640


def test_an_end_on_a_window_boundary_still_samples_the_window_that_fades_the_tail(engine: Engine) -> None:
    stream = make_stream(engine, 75)
    stream.push(speech(1.0))
    stream.interrupt()  # nothing new arrives at the end: the features stop exactly where the last window did
    windows = stream.windows.windows_done
    assert stream.features_available == windows * stream.windows.valid
    stream.end()
    assert stream.windows.windows_done == windows + 1 and stream.windows.finished


def test_pushing_after_the_end_is_an_error(engine: Engine) -> None:
    stream = make_stream(engine, 75)
    stream.end()
    with pytest.raises(RuntimeError, match="ended"):
        stream.stream.push(np.zeros(10, np.float32))


def reference_kp_cond(last: torch.Tensor, source: torch.Tensor, clip_idx: int, every: int, keep) -> torch.Tensor:
    """Audio2Motion._update_kp_cond after window ``clip_idx`` (1-based) left ``last`` before the next window."""
    if every > 0 and clip_idx % every == 0:
        kp_cond = source.clone()
        if keep is not None:
            kp_cond[keep[0] : keep[1]] = last[keep[0] : keep[1]]
        return kp_cond
    return last


def test_fixed_kp_conditioning_restarts_every_nth_window_from_the_avatar_from_the_next_window_on(
    engine: Engine,
) -> None:
    stream = make_stream(engine, 75)
    seen = []  # (windows done, the policy of the moment, cond_frame sampled with, the windows' last frame)
    request = stream.stream.window_request

    def recording():
        made = request()
        if made is not None:
            policy = (stream.fix_kp_cond, stream.fix_kp_cond_dims)
            seen.append(
                (stream.windows.windows_done, policy, made.cond_frame.clone(), stream.windows.cond_frame.clone())
            )
        return made

    stream.stream.window_request = recording
    stream.push(speech(0.6))
    changed_at = len(seen)
    stream.stream.fix_kp_cond, stream.stream.fix_kp_cond_dims = 3, (0, 202)
    stream.push(speech(0.8, seed=1))
    source = stream.stream._source
    assert changed_at == 2 and len(seen) >= 6
    for k, (done, (every, keep), cond, last) in enumerate(seen):
        assert done == k and (every, keep) == ((0, None) if k < changed_at else (3, (0, 202)))
        expected = source if k == 0 else reference_kp_cond(last, source, k, every, keep)
        assert torch.equal(cond, expected)
    assert torch.equal(seen[3][2][202:], source[202:]) and torch.equal(seen[3][2][:202], seen[3][3][:202])
    assert torch.equal(seen[4][2], seen[4][3]), "between restarts a window continues from the last frame"

"""A session's controls on the loop's side: taken at the next tick, window controls on the next window, frame
controls on the next frame stitched; bad values refused on the caller's thread while the session goes on.

One session's pipeline is driven here the way the runtime's loop drives it (intake, HuBERT, LMDM windows,
stitching), with the real LMDM and stitching network on random weights; nothing is rendered (the render
stages take the stitched keypoints as they are, see tests/engine/runtime/test_runtime.py for rendered frames).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine.audio.hubert import encode_chunks
from engine.controls import ControlError, Controls
from engine.engine import Engine
from engine.motion.conditions import emotion_vector
from engine.motion.stitching import EYE_KEYPOINTS, MotionStitcher, StitchControls, blink_schedule, stitch_posed
from engine.runtime.avatars import LoadedAvatar
from engine.runtime.config import RuntimeConfig
from engine.runtime.errors import SessionClosed
from engine.runtime.pipeline import BLINK_SCHEDULE_FRAMES, SessionPipeline
from engine.runtime.session import Session

SR = 16_000


class Loop:
    """One session and its pipeline, ticked like the runtime's loop; ``stitched`` keeps (motion, x_d) per frame."""

    def __init__(self, engine: Engine, avatar: LoadedAvatar, controls: Controls | None = None) -> None:
        self.engine, self.sampler = engine, engine.sampler()
        config = RuntimeConfig(progress=False)
        self.session = Session(0, avatar.name, False, 75, 0, config, lambda: None, controls)
        self.pipeline = SessionPipeline(
            self.session,
            avatar,
            engine.backend.stitch,
            engine.silence_feature,
            engine.step_noise(0),
            1103,
            self.session.controls,
            config,
        )
        self.requests = []
        self.stitched: list[tuple[torch.Tensor, torch.Tensor]] = []

    def tick(self, stitch: bool = True) -> None:
        """Intake, features, every window due; then stitch the whole backlog (unless ``stitch`` is False)."""
        self.pipeline.intake(0.0)
        chunks, keep = self.pipeline.motion.take_chunks(16)
        self.pipeline.motion.add_features(encode_chunks(self.engine.hubert, chunks)[:keep])
        while (request := self.pipeline.window_request()) is not None:
            self.requests.append(request)
            window = self.sampler(
                request.noise[None], request.cond_frame[None], request.cond[None], request.step_noise[:, None]
            )
            self.pipeline.complete(window[0])
        self.pipeline.finish_if_done()
        if stitch:
            self.stitch()

    def stitch(self) -> None:
        count = self.pipeline.backlog.shape[0]
        if count:
            motion, _, posed = self.pipeline.pose(count)
            _, x_d = stitch_posed([posed], self.engine.backend.stitch)
            self.stitched.extend(zip(motion, x_d))
            self.pipeline.deliver(motion, torch.zeros(count, 2, 2, 3, dtype=torch.uint8), None)

    def push(self, seconds: float, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        t = np.arange(int(seconds * SR)) / SR
        audio = (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
        self.session.push_audio(audio, SR)


def test_a_live_change_applies_from_the_next_tick_and_not_before(engine: Engine, avatar: LoadedAvatar) -> None:
    steady, changed = Loop(engine, avatar), Loop(engine, avatar)
    for loop in (steady, changed):
        loop.push(0.8)
        loop.tick(stitch=False)
    new = changed.session.update_controls(yaw=15.0, emotion="happy", vad_alpha=0.5)
    assert new.yaw == 15.0 and changed.session.controls is new
    for loop in (steady, changed):
        loop.stitch()  # the loop has not looked at the session since: the frames already final keep the old controls
    windows_before, frames_before = len(changed.requests), len(changed.stitched)
    for loop in (steady, changed):
        loop.push(0.6, seed=1)
        loop.tick()
    assert windows_before >= 2 and frames_before >= 5
    assert len(changed.requests) > windows_before and len(changed.stitched) == len(steady.stitched) > frames_before
    for (m_a, x_a), (m_b, x_b) in zip(steady.stitched[:frames_before], changed.stitched[:frames_before]):
        assert torch.equal(m_a, m_b) and torch.equal(x_a, x_b)
    neutral, happy = emotion_vector("neutral").expand(80, 8), emotion_vector("happy").expand(80, 8)
    assert all(
        torch.allclose(r.cond[:, 1024:1032], neutral) for r in steady.requests + changed.requests[:windows_before]
    )
    assert all(torch.allclose(r.cond[:, 1024:1032], happy) for r in changed.requests[windows_before:])
    controls = StitchControls(pose_offset=(0.0, 15.0, 0.0), vad_alpha=0.5)
    reference = MotionStitcher(avatar.source, stitch=engine.backend.stitch, controls=controls)
    reference.set_anchor(changed.pipeline.motion.anchor)
    motion_after = torch.stack([m for m, _ in changed.stitched[frames_before:]])
    x_after = torch.stack([x for _, x in changed.stitched[frames_before:]])
    torch.testing.assert_close(x_after, reference(motion_after)[1], rtol=0, atol=1e-6)
    assert (x_after - torch.stack([x for _, x in steady.stitched[frames_before:]])).abs().max() > 1e-3


def test_bad_controls_are_refused_with_clear_errors_and_the_session_goes_on(
    engine: Engine, avatar: LoadedAvatar
) -> None:
    loop = Loop(engine, avatar, Controls(pitch=-5.0))
    loop.push(0.6)
    loop.tick()
    before = loop.session.controls
    for changes, message in [
        ({"pitch": 120}, r"pitch must be within \[-90, 90\]"),
        ({"emotion": "bored"}, "unknown emotion 'bored'"),
        ({"expression": [0.0] * 10}, "expression must be 63 values"),
        ({"fade_target": "d1"}, "fade_target must be one of source, first"),
        ({"blink_table": [[float("nan")] * 63]}, "NaN"),
        ({"nod": 1}, "unknown control"),
        ({"self": 1}, "unknown control.*self"),
    ]:
        with pytest.raises(ControlError, match=message):
            loop.session.update_controls(**changes)
        assert loop.session.controls is before
    with pytest.raises(TypeError, match="Controls"):
        loop.session.set_controls({"pitch": 3})
    frames = len(loop.stitched)
    loop.push(0.6, seed=2)
    loop.tick()
    assert len(loop.stitched) > frames and loop.pipeline.controls is before
    loop.session.close()
    with pytest.raises(SessionClosed):
        loop.session.update_controls(pitch=1.0)


class RecordingStitcher:
    """The session's stitcher, noting the fade weights of every call."""

    def __init__(self, stitcher: MotionStitcher) -> None:
        self.stitcher, self.alphas = stitcher, []

    def pose(self, motion, rows=None, fade_alpha=None):
        self.alphas.append(None if fade_alpha is None else fade_alpha.clone())
        return self.stitcher.pose(motion, rows, fade_alpha)

    def __getattr__(self, name: str):
        return getattr(self.stitcher, name)


def test_fades_follow_the_references_setup_nd_over_the_output_frames(engine: Engine, avatar: LoadedAvatar) -> None:
    loop = Loop(engine, avatar, Controls(fade_in=6, fade_out=4))
    recorder = RecordingStitcher(loop.pipeline.stitcher)
    loop.pipeline.stitcher = recorder
    loop.push(0.9)
    loop.tick()
    loop.session.end()
    loop.tick()
    loop.tick()
    alphas = torch.cat([a for a in recorder.alphas if a is not None])
    total = len(loop.stitched)
    assert total == 23 and alphas.shape == (total,)
    expected = np.ones(total)  # StreamSDK.setup_Nd(N_d=total, fade_in=6, fade_out=4)
    for i in range(6):
        expected[i] = i / 6
    ss, ee = total - 4 - 1, total - 1
    for i in range(ss, total):
        expected[i] = max((ee - i) / (ee - ss), 0)
    np.testing.assert_allclose(alphas.numpy(), expected, atol=1e-6)


def test_blinks_come_from_the_table_on_a_seeded_open_ended_schedule_so_short_inputs_blink_too(engine, avatar) -> None:
    table = torch.linspace(-0.02, 0.02, 5 * 63).reshape(5, 63)
    loop = Loop(engine, avatar, Controls(blink_table=table, blink_gaps=(8, 40)))
    expected = blink_schedule(BLINK_SCHEDULE_FRAMES, 5, [8, 40], random.Random(0))
    assert torch.equal(loop.pipeline.stitcher.blink_indices, expected) and torch.equal(
        loop.pipeline.stitcher.blink_table, table
    )
    assert expected[8:13].tolist() == [0, 1, 2, 3, 4], "the first blink after the first gap, however short the input"
    plain = Loop(engine, avatar, Controls(blink=False))
    assert plain.pipeline.stitcher.blink_table is None
    for each in (loop, plain):
        each.push(0.6)
        each.session.end()
        each.tick()
        each.tick()
    assert len(loop.stitched) == len(plain.stitched) == 15
    eyes = [3 * k + c for k in EYE_KEYPOINTS for c in range(3)]
    blink_frames = [i for i in range(len(loop.stitched)) if expected[i] > 0]
    eye_moved = [(a[1] - b[1]).reshape(-1)[eyes].abs().max() > 0 for a, b in zip(loop.stitched, plain.stitched)]
    assert all(eye_moved[i] for i in blink_frames)
    loop.session.update_controls(blink=False)
    loop.pipeline.intake(0.0)
    assert loop.pipeline.stitcher.blink_table is None


def test_the_references_per_clip_schedule_never_blinks_under_120_frames() -> None:
    """Why short clips never blink in the reference: set_Nd(N_d=clip length) keeps 60–100 open frames at each end."""
    for seed in range(20):
        assert not blink_schedule(119, 15, 0, random.Random(seed)).any()
    assert blink_schedule(BLINK_SCHEDULE_FRAMES, 15, 0, random.Random(0))[:101].any()

"""Offline mode: the whole clip's motion as the reference's file pipeline computes it, handed to a session.

With DITTO_REFERENCE_DIR set (and the packages the reference's offline pipeline imports:
librosa, filetype, Cython), the motion is compared with the reference's own
``Wav2FeatHubert.wav2feat``, ``ConditionHandler``, ``Audio2Motion`` and
``StreamSDK._audio2motion_offline``, and its anchor with ``MotionStitch``; both sides use our
stand-in HuBERT and one deterministic stand-in for the LMDM sampler.
"""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.audio.hubert import TorchHubertRunner, offline_frame_count
from engine.audio.standin_hubert import build_standin
from engine.motion.conditions import ConditionBuilder, emotion_table, mirror_index
from engine.motion.stitching import DRIVEN_KEYS_IMAGE, DRIVEN_KEYS_VIDEO, MotionStitcher
from engine.motion.vector import MOTION_KEYS, join_motion
from engine.offline_motion import PrecomputedMotion, offline_motion, window_sampler
from tests.engine.diffusion.toy_lmdm import toy_lmdm
from tests.engine.networks.reference import reference_module

L, D, COND = 80, 265, 1103
SR = 16_000


@pytest.fixture(scope="module")
def hubert() -> TorchHubertRunner:
    return TorchHubertRunner(build_standin())


def torch_sampler(predict, calls: list):
    def sample(cond_frame: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        calls.append((cond_frame.numpy().copy(), cond.numpy().copy()))
        return torch.from_numpy(predict(cond_frame.numpy(), cond.numpy()))

    return sample


def avatar_source(frames: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Source motion (per avatar frame, reference dict layout), sc and eye features of a random avatar."""
    g = np.random.default_rng(seed)
    widths = {"pitch": 66, "yaw": 66, "roll": 66, "t": 3, "exp": 63, "scale": 1, "kp": 63}
    source = {k: (g.standard_normal((frames, w)) * 0.3).astype(np.float32) for k, w in widths.items()}
    source["scale"] += 1.5
    return {
        **source,
        "sc": (g.standard_normal(63) * 0.3).astype(np.float32),
        "eye_open": g.random((frames, 2)).astype(np.float32),
        "eye_ball": (g.standard_normal((frames, 6)) * 0.01).astype(np.float32),
    }


def our_conditions(source: dict, emotion) -> tuple[ConditionBuilder, torch.Tensor]:
    t = {k: torch.from_numpy(v) for k, v in source.items()}
    builder = ConditionBuilder(t["sc"], t["eye_open"], t["eye_ball"], COND, emotion)
    return builder, join_motion({k: t[k][0] for k in MOTION_KEYS})


def speech(num_samples: int, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    t = np.arange(num_samples) / SR
    return (
        0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.02 * g.standard_normal(num_samples)
    ).astype(np.float32)


# -- without the reference ---------------------------------------------------------------


def test_precomputed_frames_are_released_as_their_audio_is_committed() -> None:
    motion = torch.randn(5, D)
    stream = PrecomputedMotion(motion)
    assert torch.equal(stream.anchor, motion[0]), "d0 is the clip's first real frame"
    assert stream.take_chunks(16)[0].shape[0] == 0 and stream.window_request() is None
    assert not stream.can_finish
    stream.push(np.zeros(1000, np.float32))
    assert stream.can_finish and torch.equal(stream.finish(), motion[:1])
    stream.push(np.zeros(280, np.float32))
    assert torch.equal(stream.finish(), motion[1:2]) and not stream.can_finish
    stream.end()
    assert torch.equal(stream.finish(), motion[2:]), "the end releases every frame, audio or not"
    assert stream.finished and stream.frames_out == 5 and stream.samples_in == 1280


def test_precomputed_motion_must_be_frames_of_265() -> None:
    with pytest.raises(ValueError, match=r"\(N,265\) with N >= 1"):
        PrecomputedMotion(torch.zeros(0, D))
    with pytest.raises(ValueError, match=r"\(N,265\)"):
        PrecomputedMotion(torch.zeros(4, 264))


def test_each_window_draws_x_t_from_the_seed_and_reuses_the_step_noise() -> None:
    seen = []

    class Recorder:
        shape = (L, D)

        def __call__(self, x, cond_frame, cond, step_noise):
            seen.append((x, step_noise))
            return x

    step_noise = torch.randn(1, 1, L, D)
    sample = window_sampler(Recorder(), step_noise, seed=7)
    first, second = sample(torch.zeros(D), torch.zeros(L, COND)), sample(torch.zeros(D), torch.zeros(L, COND))
    generator = torch.Generator().manual_seed(7)
    assert torch.equal(first, torch.randn(L, D, generator=generator)), "x_T as a session's stream of that seed draws it"
    assert torch.equal(second, torch.randn(L, D, generator=generator))
    assert all(noise is step_noise for _, noise in seen)


def test_the_clip_is_conditioned_from_its_first_frame(hubert) -> None:
    source = avatar_source(3)
    emotion = torch.eye(8)[[0, 1, 2, 3, 5]]
    conditions, source_motion = our_conditions(source, emotion)
    calls: list = []
    motion = offline_motion(
        hubert, conditions, source_motion, speech(4480), 10, torch_sampler(toy_lmdm(COND, 0.05), calls)
    )
    assert motion.shape == (8, D), "4480 samples are 8 frames in the reference's count"
    assert len(calls) == 1
    cond_frame, cond = calls[0]
    np.testing.assert_array_equal(cond_frame, source_motion.numpy())
    frames = np.minimum(np.arange(L), 7)
    np.testing.assert_array_equal(cond[:, 1024:1032], emotion_table(emotion).numpy()[frames % 5])
    np.testing.assert_array_equal(
        cond[:, 1032:1034], source["eye_open"][mirror_index(torch.from_numpy(frames), 3).numpy()]
    )


# -- against the reference's own modules --------------------------------------------------


class ReferenceLMDM:
    """What Audio2Motion calls as its LMDM: (kp_cond (1,265), aud_cond (1,80,D), steps) -> (1,80,265)."""

    seq_frames = L

    def __init__(self, predict) -> None:
        self.predict = predict
        self.calls: list = []

    def setup(self, sampling_timesteps: int) -> None:
        pass

    def __call__(self, kp_cond: np.ndarray, aud_cond: np.ndarray, sampling_timesteps: int) -> np.ndarray:
        self.calls.append((kp_cond[0].copy(), aud_cond[0].copy()))
        return self.predict(kp_cond[0], aud_cond[0])[None]


def reference_offline(samples: np.ndarray, source: dict, emotion, overlap: int, hubert, predict):
    """The reference's offline audio-to-motion on ``samples``: (motion (N,265), avatar frame per output frame, LMDM
    calls)."""
    pipeline = reference_module(
        "stream_pipeline_offline", "librosa", "filetype", "pyximport", "cv2", "imageio", "scipy", "skimage"
    )
    wav2feat = reference_module("core.atomic_components.wav2feat", "librosa")
    audio2motion = reference_module("core.atomic_components.audio2motion")
    conditions = reference_module("core.atomic_components.condition_handler", "scipy")

    features = object.__new__(wav2feat.Wav2FeatHubert)
    features.hubert = lambda chunk: hubert.encode(torch.from_numpy(chunk)[None]).numpy()
    aud_feat = features.wav2feat(samples, sr=SR)

    frames = source["eye_open"].shape[0]
    x_s_info_lst = [{k: source[k][i : i + 1] for k in (*MOTION_KEYS, "kp")} for i in range(frames)]
    handler = conditions.ConditionHandler()
    handler.setup(
        {
            "x_s_info_lst": x_s_info_lst,
            "sc": source["sc"],
            "eye_open_lst": [source["eye_open"][i : i + 1] for i in range(frames)],
            "eye_ball_lst": [source["eye_ball"][i : i + 1] for i in range(frames)],
        },
        emotion,
    )
    lmdm = ReferenceLMDM(predict)
    a2m = object.__new__(audio2motion.Audio2Motion)
    a2m.lmdm = lmdm
    a2m.setup(handler.x_s_info_0, overlap_v2=overlap, online_mode=False)
    sdk = SimpleNamespace(
        stop_event=threading.Event(),
        audio2motion_queue=queue.Queue(),
        motion_stitch_queue=queue.Queue(),
        condition_handler=handler,
        audio2motion=a2m,
        source_info_frames=frames,
        _get_ctrl_info=lambda fid: {},
    )
    sdk.audio2motion_queue.put(aud_feat)
    pipeline.StreamSDK._audio2motion_offline(sdk)
    items = []
    while (item := sdk.motion_stitch_queue.get_nowait()) is not None:
        items.append(item)
    motion = np.stack([audio2motion._cvt_LP_motion_info(x_d_info, "dic2arr") for _, x_d_info, _ in items])
    return motion, [frame for frame, _, _ in items], [x_d_info for _, x_d_info, _ in items], lmdm.calls


@pytest.mark.parametrize(
    ("num_samples", "overlap", "avatar_frames"),
    [(3 * SR + 333, 10, 1), (4480, 10, 5), (141 * 640, 10, 5), (2 * SR + 17, 50, 1)],
)
def test_offline_motion_equals_the_reference_pipeline(
    hubert, num_samples: int, overlap: int, avatar_frames: int
) -> None:
    source = avatar_source(avatar_frames, seed=num_samples)
    emotion = [[4], [3], [3, 4], [6]]
    samples = speech(num_samples, seed=overlap)
    predict = toy_lmdm(COND, 0.05, seed=1)
    ref_motion, ref_rows, ref_infos, ref_calls = reference_offline(samples, source, emotion, overlap, hubert, predict)

    conditions, source_motion = our_conditions(source, emotion)
    calls: list = []
    motion = offline_motion(hubert, conditions, source_motion, samples, overlap, torch_sampler(predict, calls))

    assert motion.shape[0] == len(ref_motion) == offline_frame_count(num_samples)
    assert len(calls) == len(ref_calls), "the same windows"
    for (cond_frame, cond), (ref_frame, ref_cond) in zip(calls, ref_calls):
        # features differ by ~1e-6: we encode the chunks in one batch, the reference one by one
        np.testing.assert_allclose(cond, ref_cond, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(cond_frame, ref_frame, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(motion.numpy(), ref_motion, rtol=1e-5, atol=1e-5)
    assert mirror_index(torch.arange(len(ref_rows)), avatar_frames).tolist() == ref_rows, (
        "the avatar frame of each output frame"
    )

    stitch = reference_module("core.atomic_components.motion_stitch", "scipy")
    is_image = avatar_frames == 1
    ref_stitch = object.__new__(stitch.MotionStitch)
    ref_stitch.setup(
        is_image_flag=is_image, x_s_info={k: source[k][:1] for k in (*MOTION_KEYS, "kp")}, flag_stitching=False
    )
    shown = min(6, len(ref_rows))
    ref_x_d = [
        ref_stitch({k: source[k][r : r + 1] for k in (*MOTION_KEYS, "kp")}, dict(ref_infos[i]))[1]
        for i, r in enumerate(ref_rows[:shown])
    ]
    ours = MotionStitcher(
        {k: torch.from_numpy(source[k]) for k in (*MOTION_KEYS, "kp")},
        stitch=None,
        driven_keys=DRIVEN_KEYS_IMAGE if is_image else DRIVEN_KEYS_VIDEO,
        drive_eye=is_image,
    )
    ours.set_anchor(PrecomputedMotion(motion).anchor)
    _, x_d = ours(motion[:shown], torch.tensor(ref_rows[:shown]))
    np.testing.assert_allclose(x_d.numpy(), np.concatenate(ref_x_d), rtol=1e-4, atol=1e-5)

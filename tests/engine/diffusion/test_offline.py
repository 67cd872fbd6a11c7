"""Offline windows: the reference's file-render bookkeeping, window by window and for the whole clip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.diffusion.offline import (
    append_window,
    finish_sequence,
    next_cond_frame,
    sample_offline,
    window_conditions,
    window_starts,
)
from tests.engine.diffusion.toy_lmdm import toy_lmdm

L, D, C = 80, 265, 7


def transcription(
    conditions: np.ndarray, source: np.ndarray, overlap: int, predict, k: int = 3, every: int = 0, keep=None
):
    """Ditto's offline loop written out in numpy from stream_pipeline_offline.py and audio2motion.py
    (online_mode=False),
    with ``_update_kp_cond``'s fix_kp_cond = ``every`` and fix_kp_cond_dim = ``keep``."""
    valid, fuse, half = L - overlap, overlap, k // 2
    alpha = (np.arange(fuse, dtype=np.float32) / fuse)[:, None] if fuse else np.zeros((0, 1), np.float32)

    def smooth(seq, start, stop):
        out, n = seq.copy(), seq.shape[0]
        for i in range(start, stop):
            out[i, :202] = seq[max(0, i - half) : min(n, i + half + 1), :202].mean(0)
        return out

    res, kp_cond, calls, idx, clip_idx = None, source, [], 0, 0
    while idx < len(conditions):
        cond = conditions[idx : idx + L]
        if len(cond) < L:
            cond = np.concatenate([cond, np.repeat(cond[-1:], L - len(cond), 0)])
        calls.append((kp_cond, cond))
        pred = predict(kp_cond, cond)
        if res is None:
            res = smooth(pred, 0, L)
        else:
            n = res.shape[0]
            res = res.copy()
            res[n - fuse :] = res[n - fuse :] * (1 - alpha) + pred[L - valid - fuse : L - valid] * alpha
            res = np.concatenate([res, pred[L - valid :]])
            n = res.shape[0]
            res = smooth(res, n - valid - fuse, n - valid + 1)
        clip_idx += 1
        if every > 0 and clip_idx % every == 0:
            kp_cond = source.copy()
            if keep is not None:
                kp_cond[keep[0] : keep[1]] = res[res.shape[0] - overlap - 1, keep[0] : keep[1]]
        else:
            kp_cond = res[res.shape[0] - overlap - 1]
        idx += valid
    res = res[: len(conditions)]
    return smooth(res, 0, len(res)), calls


@pytest.mark.parametrize(
    ("frames", "overlap", "starts"),
    [
        (1, 10, [0]),
        (70, 10, [0]),
        (71, 10, [0, 70]),
        (80, 10, [0, 70]),
        (140, 10, [0, 70]),
        (141, 10, [0, 70, 140]),
        (100, 70, [0, 10, 20, 30, 40, 50, 60, 70, 80, 90]),
        (160, 0, [0, 80]),
    ],
)
def test_windows_start_at_multiples_of_80_minus_the_overlap_below_the_clip_length(frames, overlap, starts) -> None:
    assert window_starts(frames, overlap) == starts


@pytest.mark.parametrize("overlap", [-1, 80, 10.0, True])
def test_an_overlap_outside_0_to_79_is_refused(overlap) -> None:
    with pytest.raises(ValueError, match="overlap must be an int in"):
        window_starts(100, overlap)


def test_a_window_past_the_end_repeats_the_last_condition_row() -> None:
    conditions = torch.arange(90, dtype=torch.float32)[:, None].expand(90, C)
    window = window_conditions(conditions, 70)
    assert window.shape == (L, C)
    assert window[:20, 0].tolist() == list(range(70, 90))
    assert bool((window[20:] == 89).all()), "rows past the clip copy its last row whole (eyes and emotion included)"


@pytest.mark.parametrize("overlap", [10, 50])
def test_windows_cross_fade_over_the_whole_overlap_even_past_40(overlap: int) -> None:
    history = torch.ones(L, D)
    prediction = torch.zeros(L, D)
    fused = append_window(history, prediction, overlap, smooth_k=1)
    assert fused.shape == (2 * L - overlap, D)
    start = L - overlap
    torch.testing.assert_close(fused[start:L, 0], 1 - torch.arange(overlap) / overlap)
    assert bool((fused[:start] == 1).all()) and bool((fused[L:] == 0).all())


def test_the_next_window_is_conditioned_on_the_frame_before_it() -> None:
    history = torch.arange(150, dtype=torch.float32)[:, None].expand(150, D)
    assert next_cond_frame(history, 10)[0].item() == 139, "the next window starts at 140"


def test_the_finished_sequence_is_cut_to_the_clip_and_smoothed_again_at_its_new_end() -> None:
    history = torch.randn(150, D, generator=torch.Generator().manual_seed(1))
    done = finish_sequence(history, 100)
    assert done.shape == (100, D)
    torch.testing.assert_close(
        done[99, :202], history[98:100, :202].mean(0), msg="the last frame averages only 98 and 99"
    )
    torch.testing.assert_close(done[50, :202], history[49:52, :202].mean(0))
    assert torch.equal(done[:, 202:], history[:100, 202:])


@pytest.mark.parametrize("overlap", [10, 50, 0])
@pytest.mark.parametrize("frames", [1, 69, 70, 71, 140, 141, 213])
def test_the_whole_clip_equals_the_reference_loop(frames: int, overlap: int) -> None:
    generator = np.random.default_rng(frames + 100 * overlap)
    conditions = generator.standard_normal((frames, C)).astype(np.float32)
    source = generator.standard_normal(D).astype(np.float32)
    predict = toy_lmdm(C, 0.5)
    expected, ref_calls = transcription(conditions, source, overlap, predict)
    calls = []

    def sample(cond_frame: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        calls.append((cond_frame.numpy().copy(), cond.numpy().copy()))
        return torch.from_numpy(predict(cond_frame.numpy(), cond.numpy()))

    windows = []
    motion = sample_offline(
        torch.from_numpy(conditions), torch.from_numpy(source), overlap, sample, on_window=lambda: windows.append(1)
    )
    assert motion.shape == (frames, D), "exactly N frames, whatever N is modulo 80 − O"
    assert len(calls) == len(ref_calls) == len(windows) == len(window_starts(frames, overlap))
    for (frame, cond), (ref_frame, ref_cond) in zip(calls, ref_calls):
        np.testing.assert_allclose(frame, ref_frame, atol=1e-6)
        np.testing.assert_array_equal(cond, ref_cond)
    np.testing.assert_allclose(motion.numpy(), expected, atol=1e-6)


@pytest.mark.parametrize(("every", "keep"), [(1, (0, 202)), (2, None), (3, (199, 265))])
def test_fixed_kp_conditioning_restarts_windows_from_the_avatar_as_the_reference_does(every: int, keep) -> None:
    generator = np.random.default_rng(every)
    conditions = generator.standard_normal((420, C)).astype(np.float32)
    source = generator.standard_normal(D).astype(np.float32)
    predict = toy_lmdm(C, 0.5)
    expected, ref_calls = transcription(conditions, source, 10, predict, every=every, keep=keep)
    calls = []

    def sample(cond_frame: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        calls.append(cond_frame.numpy().copy())
        return torch.from_numpy(predict(cond_frame.numpy(), cond.numpy()))

    motion = sample_offline(
        torch.from_numpy(conditions), torch.from_numpy(source), 10, sample, fix_kp_cond=every, fix_kp_cond_dims=keep
    )
    assert len(calls) == len(ref_calls) == 6
    for frame, (ref_frame, _) in zip(calls, ref_calls):
        np.testing.assert_allclose(frame, ref_frame, atol=1e-6)
    np.testing.assert_allclose(motion.numpy(), expected, atol=1e-6)


def test_an_empty_clip_is_refused() -> None:
    with pytest.raises(ValueError, match="N >= 1"):
        sample_offline(torch.zeros(0, C), torch.zeros(D), 10, lambda f, c: torch.zeros(L, D))

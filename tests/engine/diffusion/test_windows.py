"""Streaming windows: Ditto's cross-fade, smoothing and kp_cond, with every real frame emitted exactly once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.diffusion.windows import MotionWindows, fuse_windows, kp_cond_frame, smooth_frames

L, D = 80, 265


def reference_sequence(predictions: list[np.ndarray], overlap: int, k: int = 3):
    """Transcription of Ditto's online window fusion (``Audio2Motion``, online mode): the whole fused sequence and
    kp_cond after each window."""
    valid = L - overlap
    fuse = min(overlap, valid)
    half = k // 2

    def smooth(seq, start, stop):
        out, n = seq.copy(), seq.shape[0]
        for i in range(start, stop):
            out[i, :202] = seq[max(0, i - half) : min(n, i + half + 1), :202].mean(0)
        return out

    res, conds = None, []
    for pred in predictions:
        if res is None:
            res = smooth(pred, 0, L)
        else:
            alpha = (np.arange(fuse, dtype=np.float32) / fuse)[:, None] if fuse else np.zeros((0, 1), np.float32)
            res = res.copy()
            n = res.shape[0]
            res[n - fuse :] = res[n - fuse :] * (1 - alpha) + pred[L - valid - fuse : L - valid] * alpha
            res = np.concatenate([res, pred[L - valid :]], 0)
            n = res.shape[0]
            res = smooth(res, n - valid - fuse, n - valid + 1)
        conds.append(res[res.shape[0] - overlap - 1])
    return res, conds


def run_stream(windows: MotionWindows, total: int, hop: int, predict) -> tuple[list[torch.Tensor], list]:
    """Feed ``total`` real frames in hops, then end the stream; returns emitted chunks and the plans run."""
    chunks, plans = [], []
    available = 0
    while available < total:
        available = min(available + hop, total)
        while (plan := windows.plan(available)) is not None:
            plans.append(plan)
            chunks.append(windows.push(predict(plan)))
    while (plan := windows.plan(total, ended=True)) is not None:
        plans.append(plan)
        chunks.append(windows.push(predict(plan)))
    chunks.append(windows.finish(total))
    return chunks, plans


def frame_index_prediction(plan) -> torch.Tensor:
    """A window whose every value is the stream frame index it stands for."""
    return (torch.arange(plan.start, plan.start + L, dtype=torch.float32)[:, None]).expand(L, D).clone()


def test_fuse_weights_ramp_linearly_over_the_overlap() -> None:
    history = torch.ones(100, D)
    prediction = torch.zeros(L, D)
    fused = fuse_windows(history, prediction, valid=70, fuse=10)
    assert fused.shape == (170, D)
    torch.testing.assert_close(fused[90:100, 0], 1 - torch.arange(10) / 10)
    assert bool((fused[:90] == 1).all()) and bool((fused[100:] == 0).all())


def test_fuse_takes_the_incoming_frames_that_precede_the_new_ones() -> None:
    history = torch.zeros(80, D)
    prediction = torch.arange(L, dtype=torch.float32)[:, None].expand(L, D)
    fused = fuse_windows(history, prediction, valid=5, fuse=5)
    torch.testing.assert_close(fused[75:80, 0], torch.arange(70, 75.0) * torch.arange(5) / 5)
    torch.testing.assert_close(fused[80:, 0], torch.arange(75, 80.0))


def test_smoothing_is_a_centred_mean_of_three_on_dims_0_to_202_only() -> None:
    generator = torch.Generator().manual_seed(0)
    seq = torch.randn(30, D, generator=generator)
    out = smooth_frames(seq, 10, 16)
    expected = torch.stack([seq[i - 1 : i + 2, :202].mean(0) for i in range(10, 16)])
    torch.testing.assert_close(out[10:16, :202], expected)
    assert torch.equal(out[:, 202:], seq[:, 202:]), "the expression is not smoothed"
    assert torch.equal(out[:10], seq[:10]) and torch.equal(out[16:], seq[16:])
    ends = smooth_frames(seq, 0, 30)
    torch.testing.assert_close(ends[0, :202], seq[:2, :202].mean(0))
    torch.testing.assert_close(ends[29, :202], seq[28:, :202].mean(0))


@pytest.mark.parametrize("overlap", [10, 40, 70, 75])
def test_fused_frames_and_kp_cond_equal_the_reference(overlap: int) -> None:
    generator = torch.Generator().manual_seed(overlap)
    source = torch.randn(D, generator=generator)
    windows = MotionWindows(source, overlap)
    valid = L - overlap
    total = 3 * valid + 160 - overlap
    predictions: list[torch.Tensor] = []

    def predict(plan):
        if plan.index == 0:
            assert torch.equal(windows.cond_frame, source), "the first window is conditioned on the avatar's motion"
        else:
            conds.append(windows.cond_frame.clone())
        predictions.append(torch.randn(L, D, generator=generator))
        return predictions[-1]

    conds: list[torch.Tensor] = []
    chunks, _ = run_stream(windows, total, hop=5, predict=predict)
    res, ref_conds = reference_sequence([p.numpy() for p in predictions], overlap)
    emitted = torch.cat(chunks)
    np.testing.assert_allclose(emitted.numpy(), res[overlap : overlap + total], atol=1e-6)
    for ours, ref in zip(conds, ref_conds):
        np.testing.assert_allclose(ours.numpy(), ref, atol=1e-6)
    np.testing.assert_allclose(windows.anchor.numpy(), res[0], atol=1e-6)


@pytest.mark.parametrize("overlap", [10, 40, 70, 75])
@pytest.mark.parametrize("total", [1, 4, 69, 70, 71, 133, 200])
def test_every_real_frame_is_emitted_once_from_frame_zero(overlap: int, total: int) -> None:
    windows = MotionWindows(torch.zeros(D), overlap)
    chunks, plans = run_stream(windows, total, hop=5, predict=frame_index_prediction)
    emitted = torch.cat(chunks)
    assert emitted.shape == (total, D), "exactly the real frames, no padded extras"
    torch.testing.assert_close(emitted[:, 202:], torch.arange(total, dtype=torch.float32)[:, None].expand(total, 63))
    assert [p.start for p in plans] == [k * (L - overlap) - overlap for k in range(len(plans))]
    assert windows.emitted == total and windows.finished


def test_kp_cond_is_the_frame_just_before_the_next_window() -> None:
    windows = MotionWindows(torch.zeros(D), overlap=75)
    for k in range(4):
        plan = windows.plan((k + 1) * 5)
        windows.push(frame_index_prediction(plan))
        next_start = (k + 1) * 5 - 75
        assert windows.cond_frame[202].item() == pytest.approx(next_start - 1)


def test_windows_wait_for_valid_new_frames_and_emit_with_lag_f() -> None:
    windows = MotionWindows(torch.zeros(D), overlap=70)
    assert windows.plan(9) is None
    first = windows.plan(10)
    assert (first.start, first.emit_start, first.emit_stop) == (-70, 0, 0)
    assert windows.push(frame_index_prediction(first)).shape == (0, D)
    second = windows.plan(20)
    assert (second.start, second.emit_start, second.emit_stop) == (-60, 0, 10)


def test_overlap_ten_emits_the_first_sixty_frames_the_reference_drops() -> None:
    windows = MotionWindows(torch.zeros(D), overlap=10)
    plan = windows.plan(70)
    frames = windows.push(frame_index_prediction(plan))
    assert (plan.emit_start, plan.emit_stop) == (0, 60)
    torch.testing.assert_close(frames[:, 202], torch.arange(60, dtype=torch.float32))


def test_end_of_stream_pads_only_the_last_window() -> None:
    windows = MotionWindows(torch.zeros(D), overlap=75)
    windows.push(frame_index_prediction(windows.plan(5)))
    last = windows.plan(7, ended=True)
    assert last.last and (last.emit_start, last.emit_stop) == (0, 7)
    windows.push(frame_index_prediction(last))
    assert windows.plan(7, ended=True) is None and windows.finish(7).shape == (0, D)


@pytest.mark.parametrize("overlap", [10, 40, 70, 75])
def test_a_stream_that_ends_on_a_window_boundary_still_cross_fades_its_last_frames(overlap: int) -> None:
    valid = L - overlap
    total = 3 * valid  # the last full window leaves its last F frames waiting for the next one's fade
    generator = torch.Generator().manual_seed(overlap)
    windows = MotionWindows(torch.zeros(D), overlap)
    predictions: list[torch.Tensor] = []

    def predict(plan):
        predictions.append(torch.randn(L, D, generator=generator))
        return predictions[-1]

    chunks, plans = run_stream(windows, total, hop=5, predict=predict)
    last = plans[-1]
    assert last.last and (last.start, last.emit_stop) == (total - overlap, total), "one padded window fades the tail"
    res, _ = reference_sequence([p.numpy() for p in predictions], overlap)
    np.testing.assert_allclose(torch.cat(chunks).numpy(), res[overlap : overlap + total], atol=1e-6)


def test_misuse_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="overlap"):
        MotionWindows(torch.zeros(D), overlap=80)
    windows = MotionWindows(torch.zeros(D), overlap=40)
    with pytest.raises(RuntimeError, match="plan"):
        windows.push(torch.zeros(L, D))
    with pytest.raises(RuntimeError, match="windows remain"):
        windows.finish(50)


def test_kp_cond_frame_keeps_the_chosen_dims_of_the_last_frame() -> None:
    last, source = torch.arange(265.0), -torch.ones(265)
    assert torch.equal(kp_cond_frame(last, source, windows_done=3, every=0), last)
    assert torch.equal(kp_cond_frame(last, source, windows_done=3, every=2), last)
    kept = kp_cond_frame(last, source, windows_done=4, every=2, keep=(10, 20))
    assert torch.equal(kept[10:20], last[10:20]) and (kept[:10] == -1).all() and (kept[20:] == -1).all()
    assert torch.equal(kp_cond_frame(last, source, windows_done=0, every=1), last), (
        "the first window's frame is the avatar's already"
    )


@pytest.mark.parametrize("total", [1, 4, 71, 133])
def test_early_release_also_emits_every_real_frame_once_from_frame_zero(total: int) -> None:
    windows = MotionWindows(torch.zeros(D), overlap=77, early_release=True)
    chunks, _ = run_stream(windows, total, hop=3, predict=frame_index_prediction)
    emitted = torch.cat(chunks)
    assert emitted.shape == (total, D)
    torch.testing.assert_close(emitted[:, 202:], torch.arange(total, dtype=torch.float32)[:, None].expand(total, 63))


def test_early_release_makes_a_window_final_at_once_instead_of_holding_its_cross_fade() -> None:
    held, early = (
        MotionWindows(torch.zeros(D), overlap=77),
        MotionWindows(torch.zeros(D), overlap=77, early_release=True),
    )
    for k in range(3):
        plans = [w.plan((k + 1) * 3) for w in (held, early)]
        assert plans[0].emit_stop == max((k + 1) * 3 - 3, 0), "faithful: the last 3 frames wait for the next window"
        assert plans[1].emit_stop == (k + 1) * 3, "early release: none wait"
        for w, plan in zip((held, early), plans):
            w.push(frame_index_prediction(plan))
    assert early.held == 0 and held.held == 3


def test_early_release_never_jumps_the_next_window_starts_from_the_last_frame_shown() -> None:
    windows = MotionWindows(torch.zeros(D), overlap=77, early_release=True, smooth_k=1)
    shown = windows.push(torch.zeros(L, D)) if windows.plan(3) else None
    assert windows.plan(6) is not None
    after = windows.push(torch.full((L, D), 8.0))
    sequence = torch.cat([shown, after])[:, 0]
    assert sequence[:3].abs().max() == 0, "what was shown is never changed"
    steps = sequence.diff()
    assert steps.abs().max() <= 8.0 / 4 + 1e-6, (
        "the new window's offset fades out over its 3 frames: a quarter at a time"
    )
    assert sequence[-1] == pytest.approx(8.0 * 3 / 4), "and the stream moves on towards the new window"

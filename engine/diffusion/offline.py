"""The reference's offline windows: a whole clip's conditions in, its N motion frames out.

Ditto's offline pipeline (``stream_pipeline_offline._audio2motion_offline`` with
``Audio2Motion(online_mode=False)``) differs from the streaming windows of
``engine.diffusion.windows``: there is no silence before the clip; window k covers frames
[k·V, k·V + 80) with V = 80 − O, for every k·V < N; its conditions are rows of the whole
clip's condition table (built from frame 0), and the last window's missing rows repeat the
table's last row. Consecutive windows cross-fade over all O shared frames (F = O, at any
overlap), each new window smooths its fused frames, the next window is conditioned on the
frame just before it, and once every window is sampled the sequence is cut to N frames and
smoothed again as a whole.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.diffusion.windows import SMOOTH_FRAMES, fuse_windows, kp_cond_frame, smooth_frames
from engine.motion.vector import MOTION_DIM
from engine.timebase import SEQ_FRAMES

WindowSampler = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(cond_frame (265,), cond (80,D)) -> one sampled window (80,265)."""


def check_overlap(overlap: int, seq_frames: int = SEQ_FRAMES) -> None:
    """Raise ValueError unless 0 <= overlap < seq_frames (each window must bring at least one new frame)."""
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < seq_frames:
        raise ValueError(f"overlap must be an int in [0, {seq_frames}), got {overlap!r}")


def window_starts(num_frames: int, overlap: int, seq_frames: int = SEQ_FRAMES) -> list[int]:
    """First frame of every window of an N-frame clip: 0, V, 2V, ... below N (V = seq_frames − overlap)."""
    check_overlap(overlap, seq_frames)
    return list(range(0, num_frames, seq_frames - overlap))


def window_conditions(conditions: torch.Tensor, start: int, seq_frames: int = SEQ_FRAMES) -> torch.Tensor:
    """Rows [start, start + seq_frames) of the clip's conditions (N,D); past the clip's end its last row repeats."""
    rows = torch.arange(start, start + seq_frames, device=conditions.device).clamp(max=conditions.shape[0] - 1)
    return conditions[rows]


def append_window(
    history: torch.Tensor | None, prediction: torch.Tensor, overlap: int, smooth_k: int = SMOOTH_FRAMES
) -> torch.Tensor:
    """The motion so far (n,265) with the next sampled window (80,265) fused in: n + V frames (80 for the first).

    The first window is smoothed whole; a later one cross-fades its first O frames into the
    last O of the history (weights j/O) and smooths frames [n − O, n + 1) of the result.
    """
    length = prediction.shape[0]
    if history is None:
        return smooth_frames(prediction, 0, length, smooth_k)
    valid = length - overlap
    fused = fuse_windows(history, prediction, valid, overlap)
    new_start = fused.shape[0] - valid
    return smooth_frames(fused, new_start - overlap, new_start + 1, smooth_k)


def next_cond_frame(history: torch.Tensor, overlap: int) -> torch.Tensor:
    """The next window's cond_frame: the frame just before its first, history[n − O − 1]."""
    return history[history.shape[0] - overlap - 1]


def finish_sequence(history: torch.Tensor, num_frames: int, smooth_k: int = SMOOTH_FRAMES) -> torch.Tensor:
    """The clip's motion: the first N frames of the fused windows, smoothed again as a whole sequence."""
    return smooth_frames(history[:num_frames], 0, num_frames, smooth_k)


def sample_offline(
    conditions: torch.Tensor,
    source_motion: torch.Tensor,
    overlap: int,
    sample: WindowSampler,
    smooth_k: int = SMOOTH_FRAMES,
    on_window: Callable[[], None] | None = None,
    fix_kp_cond: int = 0,
    fix_kp_cond_dims: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Every window of a clip, one after another (each conditions the next) -> its motion (N,265).

    ``conditions`` (N,D): the clip's per-frame conditions from frame 0; ``source_motion`` (265,):
    the avatar's motion vector, the first window's cond_frame; ``sample`` samples one window;
    ``on_window`` (optional) is called after each window, for progress; ``fix_kp_cond`` /
    ``fix_kp_cond_dims``: restart every n-th window from ``source_motion`` (see ``kp_cond_frame``).
    """
    num_frames = conditions.shape[0]
    if conditions.ndim != 2 or num_frames == 0:
        raise ValueError(f"conditions must be (N,D) with N >= 1, got shape {tuple(conditions.shape)}")
    if source_motion.shape != (MOTION_DIM,):
        raise ValueError(f"source_motion must be ({MOTION_DIM},), got shape {tuple(source_motion.shape)}")
    history = None
    cond_frame = source_motion
    for done, start in enumerate(window_starts(num_frames, overlap), 1):
        prediction = sample(cond_frame, window_conditions(conditions, start))
        history = append_window(history, prediction, overlap, smooth_k)
        cond_frame = kp_cond_frame(
            next_cond_frame(history, overlap), source_motion, done, fix_kp_cond, fix_kp_cond_dims
        )
        if on_window is not None:
            on_window()
    return finish_sequence(history, num_frames, smooth_k)

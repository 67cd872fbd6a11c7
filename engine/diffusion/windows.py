"""Streaming 80-frame LMDM windows: which audio frames each window covers, cross-fading, smoothing, kp_cond.

Stream frame r is the r-th real audio frame; the stream is preceded by ``overlap`` silence frames
(r < 0) so the first window needs only ``valid`` real frames. Window k covers frames
[k·V − O, (k+1)·V) with V = 80 − O. After window k, frames before (k+1)·V − F are final (the next
window only cross-fades the last F = min(O, V)) and are emitted, so every real frame is emitted
exactly once from frame 0, at any overlap. With ``early_release`` (the low-latency mode) frames
before (k+1)·V are final after window k: the next window's own frames follow, the offset
between its estimate of the last frame shown and that frame fading out over its first F frames
(no frame shown is changed, the picture never jumps). At the end of the stream the last window emits
everything up to the stream's length (its tail is padded by the caller, never emitted). A
stream that ends exactly on a window boundary still gets that last window, all padding after
its overlap, so its last F frames are cross-faded like every other frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.motion.vector import MOTION_DIM, SMOOTHED_DIMS
from engine.timebase import SEQ_FRAMES

SMOOTH_FRAMES = 3


def fuse_windows(history: torch.Tensor, prediction: torch.Tensor, valid: int, fuse: int) -> torch.Tensor:
    """Cross-fade the last ``fuse`` frames of history (N,D) with the prediction (L,D) linearly, then append its last
    ``valid`` frames."""
    length = prediction.shape[-2]
    kept = history.shape[-2] - fuse
    weight = (torch.arange(fuse, device=history.device, dtype=history.dtype) / max(fuse, 1)).unsqueeze(-1)
    incoming = prediction[..., length - valid - fuse : length - valid, :]
    blended = history[..., kept:, :] * (1 - weight) + incoming * weight
    return torch.cat([history[..., :kept, :], blended, prediction[..., length - valid :, :]], dim=-2)


def continue_from(history: torch.Tensor, prediction: torch.Tensor, valid: int, fuse: int) -> torch.Tensor:
    """Append the prediction's (L,D) last ``valid`` frames to history (N,D), shifted so that they start from history's
    last
    frame: the offset between it and the prediction's frame before them fades out linearly over ``fuse`` frames."""
    length = prediction.shape[-2]
    new = prediction[..., length - valid :, :]
    offset = history[..., -1:, :] - prediction[..., length - valid - 1 : length - valid, :]
    steps = torch.arange(1, valid + 1, device=history.device, dtype=history.dtype)
    weight = (1 - steps / (fuse + 1)).clamp(min=0).unsqueeze(-1)
    return torch.cat([history, new + offset * weight], dim=-2)


def smooth_frames(sequence: torch.Tensor, start: int, stop: int, k: int = SMOOTH_FRAMES) -> torch.Tensor:
    """Frames [start, stop) of (..., N, 265): dims [0:202] replaced by their centred mean over ±k//2 frames (clipped at
    the ends)."""
    half = k // 2
    frames = sequence.shape[-2]
    start, stop = max(start, 0), min(stop, frames)
    if half == 0 or start >= stop:
        return sequence
    lo, hi = max(start - half, 0), min(stop + half, frames)
    part = sequence[..., lo:hi, :SMOOTHED_DIMS]
    channels_first = part.transpose(-1, -2).reshape(-1, SMOOTHED_DIMS, hi - lo)
    pooled = F.avg_pool1d(channels_first, 2 * half + 1, stride=1, padding=half, count_include_pad=False)
    pooled = pooled.reshape(*part.shape[:-2], SMOOTHED_DIMS, hi - lo).transpose(-1, -2)
    result = sequence.clone()
    result[..., start:stop, :SMOOTHED_DIMS] = pooled[..., start - lo : stop - lo, :]
    return result


@dataclass(frozen=True)
class WindowPlan:
    """One window to sample: its stream frames [start, start+80) and the frames it makes final, [emit_start,
    emit_stop)."""

    index: int
    start: int
    emit_start: int
    emit_stop: int
    last: bool
    """True for the end-of-stream window: frames from ``emit_stop`` on are padding (repeat the last feature)."""


class MotionWindows:
    """Per-session window state: plan a window, sample it, ``push`` the prediction, get the final frames back."""

    def __init__(
        self,
        source_motion: torch.Tensor,
        overlap: int,
        smooth_k: int = SMOOTH_FRAMES,
        seq_frames: int = SEQ_FRAMES,
        early_release: bool = False,
    ) -> None:
        """``source_motion`` (265,): the avatar's motion vector, the first window's cond_frame; ``overlap`` O in [0,
        80);
        ``early_release``: a window's frames are final at once (see the module's docstring)."""
        if not 0 <= overlap < seq_frames:
            raise ValueError(f"overlap must be in [0, {seq_frames}), got {overlap}")
        if source_motion.shape != (MOTION_DIM,):
            raise ValueError(f"source_motion must be ({MOTION_DIM},), got shape {tuple(source_motion.shape)}")
        self.seq_frames = seq_frames
        self.overlap = overlap
        self.valid = seq_frames - overlap
        self.fuse = min(overlap, self.valid)
        self.early_release = early_release
        self.held = 0 if early_release else self.fuse
        """Frames a window keeps back for the next one's cross-fade."""
        self.smooth_k = smooth_k
        self.cond_frame = source_motion
        self.anchor: torch.Tensor | None = None
        self.windows_done = 0
        self.emitted = 0
        self.finished = False
        self._history: torch.Tensor | None = None
        self._history_end = 0
        self._keep = max(seq_frames, self.fuse + smooth_k)
        self._pending: WindowPlan | None = None

    def plan(self, available: int, ended: bool = False) -> WindowPlan | None:
        """The next window to sample given ``available`` real frames received, or None (wait, or call ``finish``)."""
        if self.finished:
            return None
        k, valid = self.windows_done, self.valid
        stop = (k + 1) * valid
        if ended:
            if available <= self.emitted:
                return None  # a stream ending on a window boundary still fades its last F frames in one more window
            last = available <= stop
        elif available >= stop:
            last = False
        else:
            return None
        emit_stop = available if last else stop - self.held
        self._pending = WindowPlan(k, k * valid - self.overlap, self.emitted, max(emit_stop, self.emitted), last)
        return self._pending

    def push(self, prediction: torch.Tensor) -> torch.Tensor:
        """The sampled window (80,265) of the last plan -> its final frames (emit_stop − emit_start, 265); updates
        cond_frame."""
        plan = self._pending
        if plan is None:
            raise RuntimeError("push() needs a window from plan() first")
        if prediction.shape != (self.seq_frames, MOTION_DIM):
            raise ValueError(
                f"a window prediction must be ({self.seq_frames},{MOTION_DIM}), got {tuple(prediction.shape)}"
            )
        if self._history is None:
            history = smooth_frames(prediction, 0, self.seq_frames, self.smooth_k)
            self.anchor = history[0]
        elif self.early_release:
            history = continue_from(self._history, prediction, self.valid, self.fuse)
            new_start = history.shape[0] - self.valid
            history = smooth_frames(history, new_start, new_start + 1, self.smooth_k)
        else:
            history = fuse_windows(self._history, prediction, self.valid, self.fuse)
            new_start = history.shape[0] - self.valid
            history = smooth_frames(history, new_start - self.fuse, new_start + 1, self.smooth_k)
        self.cond_frame = history[history.shape[0] - self.overlap - 1]
        self._history_end = (plan.index + 1) * self.valid
        self._history = history[-self._keep :]
        self._pending = None
        self.windows_done += 1
        self.finished = plan.last
        return self._take(plan.emit_stop)

    def finish(self, total: int) -> torch.Tensor:
        """End of stream with ``total`` real frames, once ``plan(total, ended=True)`` is None: the frames not yet
        emitted."""
        if self.plan(total, ended=True) is not None:
            raise RuntimeError(
                "windows remain before the end of the stream: sample what plan(total, ended=True) returns first"
            )
        self._pending = None
        frames = self._take(total) if self._history is not None and not self.finished else self._empty()
        self.finished = True
        return frames

    def _take(self, stop: int) -> torch.Tensor:
        """Frames [emitted, stop) out of the kept history; advances ``emitted``."""
        begin = self._history_end - self._history.shape[0]
        frames = self._history[self.emitted - begin : max(stop, self.emitted) - begin]
        self.emitted = max(stop, self.emitted)
        return frames

    def _empty(self) -> torch.Tensor:
        """No frames, shaped (0,265) on the session's device."""
        return self.cond_frame.new_zeros(0, MOTION_DIM)


def kp_cond_frame(
    last: torch.Tensor, source: torch.Tensor, windows_done: int, every: int = 0, keep: tuple[int, int] | None = None
) -> torch.Tensor:
    """The next window's cond_frame (the reference's ``_update_kp_cond``): the last final frame before it, except
    that with ``every`` = n > 0 each window after a multiple of n windows restarts from the avatar's own motion
    ``source`` (keeping dims [start, stop) of ``keep`` from the last frame)."""
    if windows_done == 0 or every == 0 or windows_done % every:
        return last
    frame = source.clone()
    if keep is not None:
        frame[keep[0] : keep[1]] = last[keep[0] : keep[1]]
    return frame

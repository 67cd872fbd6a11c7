"""Per-session audio-to-motion state: 16 kHz samples in, final 265-d motion frames out, on the device.

The stream does no GPU work of its own beyond small per-session tensor assembly: the runtime
takes its audio chunks and encodes them with every other session's in one HuBERT batch
(``take_chunks`` / ``add_features``), and samples its next window with every other session's in
one LMDM batch (``window_request`` / ``complete``). Every real audio frame becomes exactly one
motion frame, from frame 0, at any overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from engine.audio.hubert import FEATURE_DIM, AudioChunker
from engine.diffusion.windows import MotionWindows, WindowPlan, kp_cond_frame
from engine.latency import FAITHFUL, LatencyMode
from engine.motion.conditions import ConditionBuilder
from engine.timebase import SAMPLES_PER_FRAME


@dataclass
class WindowRequest:
    """One window to sample: its inputs (x_T and step noise from the session's own seed) and its plan."""

    plan: WindowPlan
    cond_frame: torch.Tensor
    cond: torch.Tensor
    noise: torch.Tensor
    step_noise: torch.Tensor


class MotionStream:
    """Audio in, motion frames out, driven by the runtime; ``frames_out`` counts the frames returned so far.

    ``fix_kp_cond`` / ``fix_kp_cond_dims`` (see ``kp_cond_frame``) and the condition builder's emotion may be
    changed between windows; each window request uses the values of the moment.
    """

    def __init__(
        self,
        conditions: ConditionBuilder,
        source_motion: torch.Tensor,
        silence_feature: torch.Tensor,
        overlap: int,
        step_noise: torch.Tensor,
        seed: int = 0,
        latency: LatencyMode = FAITHFUL,
    ) -> None:
        """``step_noise`` (S−1,1,80,265): the per-step noise of ``seed``; x_T comes from this stream's own generator;
        ``latency``: its HuBERT hop and whether windows release their frames before the next cross-fade."""
        self.device = source_motion.device
        self._generator = torch.Generator(self.device).manual_seed(seed)
        self._step_noise = step_noise
        self._conditions = conditions
        self._silence = silence_feature.to(self.device)
        self._source = source_motion
        self.fix_kp_cond = 0
        self.fix_kp_cond_dims: tuple[int, int] | None = None
        self.chunker = AudioChunker(latency.hop_frames)
        self.windows = MotionWindows(source_motion, overlap, early_release=latency.early_release)
        self._features = torch.empty(0, FEATURE_DIM, device=self.device)
        self._offset = 0
        self.samples_in = 0
        self.frames_out = 0
        self.ended = False

    @property
    def anchor(self) -> torch.Tensor | None:
        """The first window's first frame: the relative-motion anchor d0 once a window has been sampled."""
        return self.windows.anchor

    @property
    def features_available(self) -> int:
        """Real frames whose audio feature exists."""
        return self._offset + self._features.shape[0]

    def push(self, samples: np.ndarray) -> None:
        """Commit 16 kHz mono float32 samples to the stream."""
        if self.ended:
            raise RuntimeError("this stream has ended")
        self.chunker.push(samples)
        self.samples_in += samples.size

    def end(self) -> None:
        """End of stream: the remaining audio becomes the last chunks, so that ceil(samples / 640) frames come out in
        all."""
        self.ended = True

    def take_chunks(self, limit: int) -> tuple[np.ndarray, int]:
        """Up to ``limit`` HuBERT chunks to encode and how many of their features to keep (all but the final ones)."""
        chunks, keep = self.chunker.take(limit)
        if self.ended and self.chunker.complete_chunks == 0 and chunks.shape[0] < limit:
            final, final_keep = self.chunker.take_final()
            chunks, keep = np.concatenate([chunks, final]), keep + final_keep
        return chunks, keep

    @property
    def audio_pending(self) -> bool:
        """Whether committed audio still waits for encoding (a complete chunk, or the final ones after ``end``)."""
        return self.chunker.complete_chunks > 0 or (
            self.ended and self.chunker.samples_pushed > self.chunker.frames_emitted * SAMPLES_PER_FRAME
        )

    def samples_for_frames(self, total: int) -> int:
        """Samples still to commit before ``total`` frames in all can come out of a stream that goes on (0: none).

        Frame f is emitted by the first window k with (k+1)·V − H > f (H: the frames it holds for the next
        window's cross-fade, F, or none with early release), which needs features up
        to (k+1)·V, i.e. the HuBERT chunks up to there, look-ahead included. Live idling commits
        exactly this much silence, so that speech pushed next starts as early as it can.
        """
        if total <= self.frames_out:
            return 0
        windows = self.windows
        needed = ((total - 1 + windows.held) // windows.valid + 1) * windows.valid
        hop = self.chunker.current
        have = self.features_available + self.chunker.complete_chunks * hop
        if needed <= have:
            return 0
        chunks = self.chunker.complete_chunks + math.ceil((needed - have) / hop)
        return self.chunker.samples_for_chunks(chunks)

    @property
    def window_period(self) -> int:
        """New frames per window (V = 80 − overlap)."""
        return self.windows.valid

    @property
    def held_frames(self) -> int:
        """Frames a window holds back for the next window's cross-fade (none with early release)."""
        return self.windows.held

    def set_window_controls(self, fix_kp_cond: int, fix_kp_cond_dims: tuple[int, int] | None) -> None:
        """The ``fix_kp_cond`` controls for the windows requested from now on."""
        self.fix_kp_cond, self.fix_kp_cond_dims = fix_kp_cond, fix_kp_cond_dims

    def add_features(self, features: torch.Tensor) -> None:
        """Features (n,1024) of the next real frames, as encoded by the runtime."""
        if features.shape[0]:
            self._features = torch.cat([self._features, features.to(self.device, torch.float32)])

    def window_request(self) -> WindowRequest | None:
        """The next window's inputs when the features cover it (at most one at a time: it conditions on the
        previous)."""
        ended = self.ended and not self.audio_pending
        plan = self.windows.plan(self.features_available, ended)
        if plan is None:
            return None
        features = self._window_features(plan.start)
        cond = self._conditions(features[None], plan.start)[0]
        noise = torch.randn(
            self.windows.seq_frames, self.windows.cond_frame.shape[0], generator=self._generator, device=self.device
        )
        cond_frame = kp_cond_frame(
            self.windows.cond_frame, self._source, self.windows.windows_done, self.fix_kp_cond, self.fix_kp_cond_dims
        )
        return WindowRequest(plan, cond_frame, cond, noise, self._step_noise[:, 0])

    def complete(self, window: torch.Tensor) -> torch.Tensor:
        """The sampled window (80,265) of the last request -> the motion frames it made final."""
        motion = self.windows.push(window)
        self._trim()
        self.frames_out += motion.shape[0]
        return motion

    @property
    def finished(self) -> bool:
        """Whether every frame of an ended stream has come out."""
        return self.windows.finished

    def finish(self) -> torch.Tensor:
        """After ``end`` once no window remains: the frames not yet emitted."""
        motion = self.windows.finish(self.features_available)
        self.frames_out += motion.shape[0]
        return motion

    @property
    def can_finish(self) -> bool:
        """Whether the stream has ended, all its audio is encoded and no window remains to sample."""
        return (
            self.ended
            and not self.windows.finished
            and not self.audio_pending
            and self.windows.plan(self.features_available, ended=True) is None
        )

    def interrupt(self) -> None:
        """Forget audio and features that no sampled window has used yet; what follows starts from there."""
        used = self.windows.windows_done * self.windows.valid
        keep = min(max(used - self._offset, 0), self._features.shape[0])
        self._features = self._features[:keep]
        self.chunker.reset()
        self.samples_in = min(self.samples_in, (self._offset + keep) * SAMPLES_PER_FRAME)

    def _window_features(self, start: int) -> torch.Tensor:
        """Features of stream frames [start, start+80): silence before the stream, the last feature repeated after."""
        length = self.windows.seq_frames
        count = self._features.shape[0]
        if count == 0:
            return self._silence.expand(length, -1)
        first = start - self._offset
        if (
            first >= 0 and first + length <= count
        ):  # all received (so all real: the offset is never negative): a plain slice
            return self._features[first : first + length]
        frames = torch.arange(start, start + length, device=self.device)
        rows = self._features[(frames - self._offset).clamp(0, count - 1)]
        return torch.where((frames < 0).unsqueeze(-1), self._silence, rows)

    def _trim(self) -> None:
        """Drop features no later window can reach (the next starts at windows_done·V − O)."""
        next_start = self.windows.windows_done * self.windows.valid - self.windows.overlap
        drop = min(max(next_start - self._offset, 0), max(self._features.shape[0] - 1, 0))
        if drop:
            self._features = self._features[drop:]
            self._offset += drop

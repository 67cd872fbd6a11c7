"""Per-session audio-to-motion: 16 kHz samples in, final 265-d motion frames out, on the device.

HuBERT features accumulate as hops complete; whenever they cover a new window, the LMDM
samples it (one graph launch) and the window bookkeeping returns the frames it made final.
Every real audio frame becomes exactly one motion frame, from frame 0, at any overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.audio.hubert import FEATURE_DIM, FRAME_SAMPLES, HubertFeatureStream
from engine.diffusion.windows import MotionWindows
from engine.motion.conditions import ConditionBuilder

if TYPE_CHECKING:
    from engine.diffusion.graphed import GraphedSampler


class MotionStream:
    """Audio in, motion frames out; ``frames_out`` counts the motion frames returned so far."""

    def __init__(
        self,
        hubert,
        sampler: GraphedSampler,
        conditions: ConditionBuilder,
        source_motion: torch.Tensor,
        silence_feature: torch.Tensor,
        overlap: int,
        seed: int = 0,
    ) -> None:
        """``sampler`` may be shared by sessions; the initial noise of each window comes from this stream's own seeded generator."""
        self.device = source_motion.device
        self._generator = torch.Generator(self.device).manual_seed(seed)
        self._sampler = sampler
        self._conditions = conditions
        self._silence = silence_feature.to(self.device)
        self._features_stream = HubertFeatureStream(hubert)
        self.windows = MotionWindows(source_motion, overlap)
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

    def push(self, samples: np.ndarray) -> torch.Tensor:
        """16 kHz mono float32 samples -> the motion frames (n,265) this audio made final (often none)."""
        if self.ended:
            raise RuntimeError("this stream has ended")
        self.samples_in += samples.size
        self._append(self._features_stream.push(samples))
        return self._advance(ended=False)

    def end(self) -> torch.Tensor:
        """End of stream: the remaining frames, so that ceil(samples / 640) frames came out in all."""
        if self.ended:
            return self._features.new_zeros(0, self.windows.cond_frame.shape[0])
        self._append(self._features_stream.flush())
        self.ended = True
        return self._advance(ended=True)

    def interrupt(self) -> None:
        """Forget audio and features that no sampled window has used yet; what follows starts from there."""
        used = self.windows.windows_done * self.windows.valid
        keep = min(max(used - self._offset, 0), self._features.shape[0])
        self._features = self._features[:keep]
        self._features_stream.reset()
        self.samples_in = min(self.samples_in, (self._offset + keep) * FRAME_SAMPLES)

    def _append(self, features: torch.Tensor) -> None:
        if features.shape[0]:
            self._features = torch.cat([self._features, features.to(self.device, torch.float32)])

    def _advance(self, ended: bool) -> torch.Tensor:
        parts = []
        while (plan := self.windows.plan(self.features_available, ended)) is not None:
            features = self._window_features(plan.start)
            cond = self._conditions(features[None], plan.start)
            noise = torch.randn((1, *self._sampler.sampler.shape), generator=self._generator, device=self.device)
            window = self._sampler(self.windows.cond_frame[None], cond, noise)[0]
            parts.append(self.windows.push(window))
            self._trim()
        if ended:
            parts.append(self.windows.finish(self.features_available))
        motion = torch.cat(parts) if parts else self.windows.cond_frame.new_zeros(0, self.windows.cond_frame.shape[0])
        self.frames_out += motion.shape[0]
        return motion

    def _window_features(self, start: int) -> torch.Tensor:
        """Features of stream frames [start, start+80): silence before the stream, the last feature repeated after."""
        length = self.windows.seq_frames
        count = self._features.shape[0]
        if count == 0:
            return self._silence.expand(length, -1)
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

"""The reference's offline mode for file renders: the whole clip's motion first, then a session renders it.

``offline_motion`` encodes the whole clip with HuBERT as the reference's offline mode does,
builds its conditions from frame 0 and samples the windows one after another
(``engine.diffusion.offline``). ``PrecomputedMotion`` hands that motion to a runtime session
in place of a ``MotionStream``: each frame is released once its audio is committed, so the
session renders it through the same batches and paste-back as any other and every frame
carries its own audio. The relative-motion anchor d0 is the clip's first frame, as in the
reference's offline pipeline.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from engine.audio.hubert import CHUNK_SAMPLES, HubertRunner, offline_features
from engine.diffusion.graphed import BucketedSampler
from engine.diffusion.offline import WindowSampler, check_overlap, sample_offline, window_starts
from engine.motion.conditions import ConditionBuilder
from engine.motion.vector import MOTION_DIM
from engine.timebase import SAMPLES_PER_FRAME


def window_sampler(sampler: BucketedSampler, step_noise: torch.Tensor, seed: int) -> WindowSampler:
    """One window at a time through the engine's sampler: x_T from a generator seeded with ``seed`` (as a
    session's stream draws it), the step noise (S−1,1,80,265) of that seed reused for every window."""
    frames, dim = sampler.shape
    generator = torch.Generator(step_noise.device).manual_seed(seed)

    def sample(cond_frame: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(frames, dim, generator=generator, device=step_noise.device)
        return sampler(noise[None], cond_frame[None], cond[None], step_noise)[0]

    return sample


def offline_motion(
    hubert: HubertRunner,
    conditions: ConditionBuilder,
    source_motion: torch.Tensor,
    samples: np.ndarray,
    overlap: int,
    sample: WindowSampler,
    progress: bool = False,
    fix_kp_cond: int = 0,
    fix_kp_cond_dims: tuple[int, int] | None = None,
) -> torch.Tensor:
    """A whole 16 kHz mono clip -> its motion (N,265) on the conditions' device, N = offline_frame_count(len);
    ``fix_kp_cond`` / ``fix_kp_cond_dims`` as the reference's (see ``engine.diffusion.windows.kp_cond_frame``)."""
    check_overlap(overlap)
    features = offline_features(hubert, samples).to(conditions.device, torch.float32)
    table = conditions(features[None], 0)[0]
    windows = len(window_starts(table.shape[0], overlap))
    with tqdm(total=windows, desc="motion", unit="window", disable=not progress) as bar:
        return sample_offline(
            table,
            source_motion.to(table.device, torch.float32),
            overlap,
            sample,
            on_window=bar.update,
            fix_kp_cond=fix_kp_cond,
            fix_kp_cond_dims=fix_kp_cond_dims,
        )


class PrecomputedMotion:
    """A session's ``MotionSource`` when the motion is already computed: what ``MotionStream`` is for streamed audio.

    The session still commits its audio (the frames carry it), but nothing is encoded or
    sampled: frame i is released once the audio of frames 0..i is committed, and every frame
    once the session has ended.
    """

    def __init__(self, motion: torch.Tensor) -> None:
        """``motion`` (N,265), N >= 1, on the avatar's device."""
        if motion.ndim != 2 or motion.shape[1] != MOTION_DIM or motion.shape[0] == 0:
            raise ValueError(
                f"precomputed motion must be (N,{MOTION_DIM}) with N >= 1, got shape {tuple(motion.shape)}"
            )
        self._motion = motion
        self.anchor = motion[0]
        self.samples_in = 0
        self.frames_out = 0
        self.ended = False
        self.audio_pending = False

    def push(self, samples: np.ndarray) -> None:
        """Count committed 16 kHz samples (the motion does not depend on them)."""
        if self.ended:
            raise RuntimeError("this stream has ended")
        self.samples_in += samples.size

    def end(self) -> None:
        """End of audio: every remaining frame is released."""
        self.ended = True

    window_period = None
    """No windows: nothing to keep in phase with other sessions'."""
    held_frames = 0

    def set_window_controls(self, fix_kp_cond: int, fix_kp_cond_dims: tuple[int, int] | None) -> None:
        """Nothing to change: the motion took its window controls when it was computed."""

    def samples_for_frames(self, total: int) -> int:
        """Samples still to commit before ``total`` frames in all are released (0: none)."""
        return max(min(total, self._motion.shape[0]) * SAMPLES_PER_FRAME - self.samples_in, 0)

    def take_chunks(self, limit: int) -> tuple[np.ndarray, int]:
        """No audio to encode."""
        return np.zeros((0, CHUNK_SAMPLES), np.float32), 0

    def add_features(self, features: torch.Tensor) -> None:
        """Refuses features: it hands out no chunks to encode."""
        if features.shape[0]:
            raise RuntimeError("precomputed motion encodes no audio")

    def window_request(self) -> None:
        """No window to sample."""
        return None

    def complete(self, window: torch.Tensor) -> torch.Tensor:
        """Refuses windows: it requests none."""
        raise RuntimeError("precomputed motion samples no windows")

    @property
    def _ready(self) -> int:
        """Frames whose audio is committed (all once ended)."""
        total = self._motion.shape[0]
        return total if self.ended else min(self.samples_in // SAMPLES_PER_FRAME, total)

    @property
    def can_finish(self) -> bool:
        """Whether frames are ready that were not handed out yet."""
        return self._ready > self.frames_out

    def finish(self) -> torch.Tensor:
        """The ready frames not handed out yet (their motion is final: nothing is left to sample)."""
        ready = self._ready
        motion = self._motion[self.frames_out : ready]
        self.frames_out = max(ready, self.frames_out)
        return motion

    @property
    def finished(self) -> bool:
        """Whether every frame has been handed out."""
        return self.frames_out >= self._motion.shape[0]

    def interrupt(self) -> None:
        """Drop the frames not handed out yet: the motion belongs to the clip that was interrupted."""
        self.frames_out = self._motion.shape[0]

"""A live session: audio pushed in, frames of the avatar speaking it out, every tensor on the device.

Per hop of audio the session extracts HuBERT features, samples an LMDM window when enough
new frames have arrived, stitches the motion onto the avatar and renders the frames. Work is
only launched, never waited for: diffusion runs on one CUDA stream and rendering on another,
so window k+1 diffuses while window k renders, and each frame carries the CUDA event that
says when it is ready. Every frame also carries the 640 audio samples it speaks, so sinks
keep audio and video on one clock: frame i is at i/25 s, derived from the sample count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.audio.pcm import StreamingResampler
from engine.motion.conditions import ConditionBuilder, Emotion, mirror_index
from engine.audio.hubert import FRAME_SAMPLES, SAMPLE_RATE
from engine.motion_stream import MotionStream
from engine.motion.stitching import DRIVEN_KEYS_IMAGE, DRIVEN_KEYS_VIDEO, SOURCE_KEYS, MotionStitcher
from engine.motion.vector import join_motion
from engine.render.paste_back import PasteBack

if TYPE_CHECKING:
    from avatars.cache import Avatar
    from engine.engine import Engine

FPS = 25
HOP_FRAMES = 5


@dataclass
class Frame:
    """One output frame: full-size RGB uint8 (H,W,3) on the device, its time, and the audio it speaks."""

    index: int
    image: torch.Tensor
    audio: np.ndarray
    ready: torch.cuda.Event | None

    @property
    def pts(self) -> Fraction:
        """Presentation time in seconds, from the frame index (never from wall time)."""
        return Fraction(self.index, FPS)

    def is_ready(self) -> bool:
        """Whether the GPU has finished this frame (always true on the CPU)."""
        return self.ready is None or self.ready.query()


class Session:
    """Per-session state over an engine's shared networks; create with ``Engine.session``."""

    def __init__(self, engine: Engine, avatar: Avatar, overlap: int, emotion: Emotion, seed: int) -> None:
        self.engine = engine
        self.avatar = avatar
        self.device = engine.device
        self.overlap = overlap
        self._emotion = emotion
        self._seed = seed
        self._f_s = avatar.f_s.to(self.device, engine.backend.dtype)
        self._avatar_frames = avatar.f_s.shape[0]
        self._source = {k: getattr(avatar, k).to(self.device, torch.float32) for k in SOURCE_KEYS}
        self._paste = PasteBack(avatar.frames.to(self.device), avatar.M_c2o.to(self.device), avatar.mask_crop.to(self.device))
        cuda = self.device.type == "cuda"
        self._diffusion_stream = torch.cuda.Stream(self.device) if cuda else None
        self._render_stream = torch.cuda.Stream(self.device) if cuda else None
        self._queue: deque[Frame] = deque()
        self._resampler: StreamingResampler | None = None
        self._rate: int | None = None
        self._channels: int | None = None
        self._audio = np.zeros(0, np.float32)
        self._audio_offset = 0
        self._frames_out = 0
        self.motion = self._new_motion_stream()
        self._stitcher = self._new_stitcher()

    # -- audio in -------------------------------------------------------------------------

    def push_audio(self, pcm: np.ndarray, sample_rate: int, channels: int | None = None) -> int:
        """Add PCM at any common rate and layout; launch the work it completes. Returns frames queued."""
        if self.motion.ended:
            raise RuntimeError("this session has ended; open a new one with engine.session(avatar)")
        if self._resampler is None or sample_rate != self._rate or channels != self._channels:
            if self._resampler is not None:
                self._accept(self._resampler.flush())
            self._resampler = StreamingResampler(sample_rate, channels or 1)
            self._rate, self._channels = sample_rate, channels
        self._accept(self._resampler.push(pcm))
        return len(self._queue)

    def push_silence(self, seconds: float) -> int:
        """Idle: feed silence so the head keeps living while nobody speaks (the maintainers' recommendation)."""
        return self.push_audio(np.zeros(int(round(seconds * SAMPLE_RATE)), np.float32), SAMPLE_RATE)

    def end(self) -> int:
        """End of stream: launch every remaining real frame (exactly ceil(samples / 640) in all)."""
        if not self.motion.ended:
            if self._resampler is not None:
                self._accept(self._resampler.flush())
            with self._on(self._diffusion_stream):
                motion = self.motion.end()
            self._render(motion)
        return len(self._queue)

    def interrupt(self) -> None:
        """Drop speech not yet turned into motion; the stream goes on from silence within one hop."""
        self.motion.interrupt()
        self._resampler = None
        self._audio = self._audio[: max(self.motion.samples_in - self._audio_offset, 0)]

    # -- frames out -----------------------------------------------------------------------

    @property
    def frames_queued(self) -> int:
        """Frames launched but not yet taken."""
        return len(self._queue)

    def take_ready(self) -> list[Frame]:
        """Frames whose GPU work is done, in order, without waiting."""
        out = []
        while self._queue and self._queue[0].is_ready():
            out.append(self._queue.popleft())
        return out

    def take_all(self) -> list[Frame]:
        """Every queued frame, waiting for the GPU as needed (offline use)."""
        out = list(self._queue)
        self._queue.clear()
        if out and out[-1].ready is not None:
            out[-1].ready.synchronize()
        return out

    async def frames(self, live: bool = False, poll: float = 0.002) -> AsyncIterator[Frame]:
        """Frames as they become ready; ``live`` feeds silence whenever audio runs behind wall time, until ``end``."""
        start = time.monotonic()
        while True:
            ready = self.take_ready()
            for frame in ready:
                yield frame
            if self.motion.ended and not self._queue:
                return
            if live and not self.motion.ended and not self._queue:
                if time.monotonic() - start > self.motion.samples_in / SAMPLE_RATE:
                    self.push_silence(HOP_FRAMES / FPS)
            if not ready:
                await asyncio.sleep(poll)

    # -- the pipeline ---------------------------------------------------------------------

    def _new_motion_stream(self) -> MotionStream:
        engine, avatar = self.engine, self.avatar
        conditions = ConditionBuilder(
            avatar.kp[0].to(self.device), avatar.eye_open.to(self.device), avatar.eye_ball.to(self.device),
            engine.cond_width, self._emotion,
        )
        source_motion = join_motion({k: v[:1] for k, v in self._source.items() if k != "kp"})[0]
        return MotionStream(
            engine.hubert, engine.sampler_for_seed(self._seed), conditions, source_motion,
            engine.silence_feature, self.overlap, self._seed,
        )

    def _new_stitcher(self) -> MotionStitcher:
        image = bool(self.avatar.is_image)
        return MotionStitcher(
            self._source,
            stitch=self.engine.backend.stitch,
            driven_keys=DRIVEN_KEYS_IMAGE if image else DRIVEN_KEYS_VIDEO,
            drive_eye=image,
        )

    def _accept(self, samples: np.ndarray) -> None:
        if samples.size == 0:
            return
        self._audio = np.concatenate([self._audio, samples])
        with self._on(self._diffusion_stream):
            motion = self.motion.push(samples)
            if self._stitcher.anchor is None and self.motion.anchor is not None:
                self._stitcher.set_anchor(self.motion.anchor)
        self._render(motion)

    def _render(self, motion: torch.Tensor) -> None:
        """Stitch, warp, decode and paste back ``motion`` (n,265) on the render stream; queue the frames."""
        count = motion.shape[0]
        if count == 0:
            return
        first = self._frames_out
        if self._render_stream is not None:
            self._render_stream.wait_stream(self._diffusion_stream)
            motion.record_stream(self._render_stream)
        with self._on(self._render_stream):
            index = mirror_index(torch.arange(first, first + count, device=self.device), self._avatar_frames)
            x_s, x_d = self._stitcher(motion, index)
            batch = self.engine.render_batch
            for lo in range(0, count, batch):
                rows = index[lo : lo + batch]
                rgb = self.engine.backend.render(self._f_s[rows], x_s[lo : lo + batch], x_d[lo : lo + batch])
                images = self._paste(rgb, rows)
                event = None
                if self._render_stream is not None:
                    event = torch.cuda.Event()
                    event.record(self._render_stream)
                for j in range(images.shape[0]):
                    self._queue.append(Frame(first + lo + j, images[j], self._frame_audio(first + lo + j), event))
        self._frames_out += count
        drop = self._frames_out * FRAME_SAMPLES - self._audio_offset
        if drop > 0:
            self._audio = self._audio[drop:]
            self._audio_offset += drop

    def _frame_audio(self, index: int) -> np.ndarray:
        """The 640 samples frame ``index`` speaks (zeros past the end of the audio)."""
        lo = index * FRAME_SAMPLES - self._audio_offset
        chunk = self._audio[max(lo, 0) : max(lo + FRAME_SAMPLES, 0)]
        return np.pad(chunk, (0, FRAME_SAMPLES - chunk.size)) if chunk.size < FRAME_SAMPLES else chunk.copy()

    @staticmethod
    def _on(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

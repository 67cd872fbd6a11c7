"""Offline MP4 writer: RGB frames at 25 fps + 16 kHz mono audio -> H.264 (libx264) + AAC through PyAV.

This is the software-encoder path: each frame is copied to the host (once) and converted to
yuv420p by libswscale. Frame i is shown at i / fps exactly; audio times come from the sample
count. Audio is encoded only up to the video written so far, so ``close()`` can make both
streams end together (the audio is trimmed or padded with silence to the video's duration).
AAC is encoded at 16 kHz, one of its standard rates, so no resampling is needed.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import av
import numpy as np
import torch

AUDIO_RATE = 16_000
AAC_BITRATE = 64_000
AAC_FRAME = 1024


class Mp4Writer:
    """Write an MP4 file frame by frame; use as a context manager or call ``close()`` (idempotent)."""

    def __init__(
        self,
        path: str | Path,
        width: int,
        height: int,
        fps: int = 25,
        crf: int = 20,
        preset: str = "fast",
    ) -> None:
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            raise ValueError(f"H.264 yuv420p needs a positive, even width and height, got {width}x{height}")
        if AUDIO_RATE % fps:
            raise ValueError(f"fps must divide {AUDIO_RATE} so each frame spans whole audio samples, got {fps}")
        self.path = Path(path)
        self.width, self.height, self.fps = width, height, fps
        self.frames_written = 0
        self._samples_per_frame = AUDIO_RATE // fps
        self._container = av.open(str(self.path), mode="w")
        self._video = self._container.add_stream("libx264", rate=fps)
        self._video.width, self._video.height, self._video.pix_fmt = width, height, "yuv420p"
        self._video.options = {"crf": str(crf), "preset": preset}
        self._audio = self._container.add_stream("aac", rate=AUDIO_RATE, layout="mono")
        self._audio.bit_rate = AAC_BITRATE
        self._pending: deque[np.ndarray] = deque()
        self._pending_samples = 0
        self._audio_encoded = 0
        self._closed = False

    @property
    def duration(self) -> float:
        """Seconds of video written so far."""
        return self.frames_written / self.fps

    def write_frame(self, frame: np.ndarray | torch.Tensor) -> None:
        """Append one uint8 RGB frame (H, W, 3), numpy or torch on any device."""
        self._check_open()
        self._encode_video(self._to_host(frame, batched=False))
        self._drain_audio(final=False)

    def write_frames(self, frames: np.ndarray | torch.Tensor) -> None:
        """Append a batch of uint8 RGB frames (B, H, W, 3); a device tensor is copied to the host once."""
        self._check_open()
        for frame in self._to_host(frames, batched=True):
            self._encode_video(frame)
        self._drain_audio(final=False)

    def write_audio(self, samples: np.ndarray) -> None:
        """Append 16 kHz mono float32 samples (1-D, full scale 1.0)."""
        self._check_open()
        if not isinstance(samples, np.ndarray) or samples.dtype != np.float32 or samples.ndim != 1:
            raise TypeError(
                "write_audio() takes 1-D float32 numpy samples at 16 kHz; convert with engine.audio.pcm.to_mono_16k"
            )
        self._pending.append(samples.copy())
        self._pending_samples += samples.size
        self._drain_audio(final=False)

    def close(self) -> None:
        """Fit the audio to the video's duration, flush both encoders and finish the file; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drain_audio(final=True)
            for packet in self._video.encode(None):
                self._container.mux(packet)
            for packet in self._audio.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: the writer is closed")

    def _to_host(self, frames: np.ndarray | torch.Tensor, batched: bool) -> np.ndarray:
        if isinstance(frames, torch.Tensor):
            frames = frames.detach().cpu().numpy()
        if not isinstance(frames, np.ndarray):
            raise TypeError(f"frames must be a numpy array or torch tensor, got {type(frames).__name__}")
        expected = (self.height, self.width, 3)
        shape_ok = frames.shape[1:] == expected if batched else frames.shape == expected
        if frames.dtype != np.uint8 or frames.ndim != len(expected) + batched or not shape_ok:
            want = f"({'B, ' if batched else ''}{self.height}, {self.width}, 3) uint8 RGB"
            raise ValueError(f"frames must be {want}, got {frames.shape} {frames.dtype}")
        return frames

    def _encode_video(self, rgb: np.ndarray) -> None:
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = self.frames_written
        frame.time_base = Fraction(1, self.fps)
        for packet in self._video.encode(frame):
            self._container.mux(packet)
        self.frames_written += 1

    def _drain_audio(self, final: bool) -> None:
        """Encode pending audio up to the video written so far; at the end, trim or pad to exactly that."""
        room = self.frames_written * self._samples_per_frame - self._audio_encoded
        if final:
            samples = self._take(min(room, self._pending_samples))
            self._pending.clear()
            self._pending_samples = 0
            self._encode_audio(np.pad(samples, (0, room - samples.size)))
        else:
            self._encode_audio(self._take(min(room, self._pending_samples) // AAC_FRAME * AAC_FRAME))

    def _take(self, count: int) -> np.ndarray:
        """Pop the first ``count`` pending samples."""
        parts = []
        while count > 0:
            head = self._pending.popleft()
            if head.size > count:
                self._pending.appendleft(head[count:])
                head = head[:count]
            parts.append(head)
            count -= head.size
            self._pending_samples -= head.size
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def _encode_audio(self, samples: np.ndarray) -> None:
        for start in range(0, samples.size, AAC_FRAME):
            block = samples[start : start + AAC_FRAME]
            frame = av.AudioFrame.from_ndarray(block[None], format="fltp", layout="mono")
            frame.sample_rate = AUDIO_RATE
            frame.pts = self._audio_encoded
            frame.time_base = Fraction(1, AUDIO_RATE)
            for packet in self._audio.encode(frame):
                self._container.mux(packet)
            self._audio_encoded += block.size

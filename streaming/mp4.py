"""Offline MP4 writer: RGB frames at 25 fps + mono audio -> H.264 (libx264) + AAC through PyAV.

The offline render's path. Video goes through the same x264 encoder as live output (RGB ->
I420 in torch on the frames' device, one copy to the host per frame, or per batch with ``write_frames``), here in
CRF mode for files.
Frame i is shown at i / fps exactly; audio times come from the sample count. Audio is encoded
only up to the video written so far, so ``close()`` can make both streams end together (the
audio is trimmed or padded with silence to the video's duration). AAC is encoded at the
audio's own rate (48 kHz, the frames' rate, by default), so no resampling is needed.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import av
import numpy as np
import torch

from engine.timebase import FPS
from streaming.encoders.audio import AAC_BITRATE
from streaming.encoders.colour import rgb_to_i420_batch
from streaming.encoders.h264 import H264Settings
from streaming.encoders.x264 import X264Encoder
from streaming.frames import AUDIO_RATE, check_size

AAC_FRAME = 1024


class Mp4Writer:
    """Write an MP4 file frame by frame; use as a context manager or call ``close()`` (idempotent)."""

    def __init__(
        self,
        path: str | Path | BinaryIO,
        width: int,
        height: int,
        fps: int = FPS,
        crf: int = 20,
        preset: str = "fast",
        audio_rate: int = AUDIO_RATE,
    ) -> None:
        check_size(width, height)
        if fps != FPS:
            raise ValueError(f"the writer's video runs at the engine's {FPS} fps, got {fps}")
        if audio_rate % fps:
            raise ValueError(
                f"audio_rate must be a multiple of {fps} so each frame spans whole samples, got {audio_rate}"
            )
        self._file = None if isinstance(path, (str, Path)) else path
        """A file object given in place of a path (created by the caller, e.g. exclusively), closed with the writer."""
        self.path = Path(path) if self._file is None else None
        self.width, self.height, self.fps, self.audio_rate = width, height, fps, audio_rate
        self.frames_written = 0
        self._samples_per_frame = audio_rate // fps
        self._encoder = X264Encoder(width, height, H264Settings(crf=crf, preset=preset), live=False)
        self._container = av.open(str(self.path) if self._file is None else self._file, mode="w", format="mp4")
        self._video = self._container.add_mux_stream("h264", rate=fps, width=width, height=height)
        self._video.time_base = Fraction(1, fps)
        self._audio = self._container.add_stream("aac", rate=audio_rate, layout="mono")
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
        self._encode_video(self._frames(frame, batched=False))
        self._drain_audio(final=False)

    def write_frames(self, frames: np.ndarray | torch.Tensor) -> None:
        """Append a batch of uint8 RGB frames (B, H, W, 3), converted together on their device and copied to the host
        at once: one wait for the device per batch, not one per frame (a third of a GPU file render's time)."""
        self._check_open()
        pictures = rgb_to_i420_batch(self._frames(frames, batched=True)).cpu().numpy()
        for picture in pictures:
            self._mux_video(self._encoder.encode_picture(picture, self.frames_written))
            self.frames_written += 1
        self._drain_audio(final=False)

    def write_picture(self, picture: np.ndarray) -> None:
        """Append one picture already in I420 (an (H * 3/2, W) uint8 host array, as a frame ring holds it)."""
        self._check_open()
        if picture.dtype != np.uint8 or picture.shape != (self.height * 3 // 2, self.width):
            raise ValueError(
                f"an I420 picture must be ({self.height * 3 // 2}, {self.width}) uint8, got {picture.shape} "
                f"{picture.dtype}"
            )
        self._mux_video(self._encoder.encode_picture(picture, self.frames_written))
        self.frames_written += 1
        self._drain_audio(final=False)

    def write_audio(self, samples: np.ndarray) -> None:
        """Append mono float32 samples at ``audio_rate`` (1-D, full scale 1.0)."""
        self._check_open()
        if not isinstance(samples, np.ndarray) or samples.dtype != np.float32 or samples.ndim != 1:
            raise TypeError(f"write_audio() takes 1-D float32 numpy samples at {self.audio_rate} Hz")
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
            self._mux_video(self._encoder.flush())
            for packet in self._audio.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()
            if self._file is not None:
                self._file.close()

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path or 'the MP4'}: the writer is closed")

    def _frames(self, frames: np.ndarray | torch.Tensor, batched: bool) -> torch.Tensor:
        """Frames as a uint8 tensor on their own device (numpy arrays become CPU tensors)."""
        if isinstance(frames, np.ndarray):
            frames = torch.from_numpy(frames)
        if not isinstance(frames, torch.Tensor):
            raise TypeError(f"frames must be a numpy array or torch tensor, got {type(frames).__name__}")
        expected = (self.height, self.width, 3)
        shape_ok = tuple(frames.shape[1:]) == expected if batched else tuple(frames.shape) == expected
        if frames.dtype != torch.uint8 or frames.ndim != len(expected) + batched or not shape_ok:
            want = f"({'B, ' if batched else ''}{self.height}, {self.width}, 3) uint8 RGB"
            raise ValueError(f"frames must be {want}, got {tuple(frames.shape)} {frames.dtype}")
        return frames.detach()

    def _encode_video(self, rgb: torch.Tensor) -> None:
        self._mux_video(self._encoder.encode(rgb, self.frames_written))
        self.frames_written += 1

    def _mux_video(self, packets: list) -> None:
        for encoded in packets:
            packet = av.Packet(encoded.data)
            packet.pts = packet.dts = encoded.index
            packet.duration = (
                1  # explicit, so the last frame's length (and the track's) never rests on the muxer's guess
            )
            packet.time_base = Fraction(1, self.fps)
            packet.is_keyframe = encoded.keyframe
            packet.stream = self._video
            self._container.mux(packet)

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
            frame.sample_rate = self.audio_rate
            frame.pts = self._audio_encoded
            frame.time_base = Fraction(1, self.audio_rate)
            for packet in self._audio.encode(frame):
                self._container.mux(packet)
            self._audio_encoded += block.size

"""Reading an audio file of any container and codec PyAV knows, as float32 PCM at its own rate."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

from engine.audio.pcm import PcmError


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """(samples (N, C) float32 in [-1, 1], sample rate) of the file's first audio stream."""
    path = Path(path)
    if not path.is_file():
        raise PcmError(f"audio file not found: {path}")
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise PcmError(f"{path} has no audio stream")
            stream = container.streams.audio[0]
            rate = stream.codec_context.sample_rate
            channels = stream.codec_context.channels
            resampler = av.AudioResampler(format="flt", layout=stream.layout.name, rate=rate)
            parts = [
                out.to_ndarray().reshape(-1, channels)
                for frame in container.decode(stream)
                for out in resampler.resample(frame)
            ]
    except av.error.FFmpegError as exc:
        raise PcmError(f"cannot decode {path} as audio: {exc}") from exc
    if not parts:
        raise PcmError(f"{path} holds no audio samples")
    return np.concatenate(parts).astype(np.float32, copy=False), rate

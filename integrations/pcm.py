"""The 16-bit PCM that voice-agent frameworks carry, to and from the engine's float32 samples (``engine.audio.pcm``'s
rules: the push WebSocket and the LiveKit room output convert the same way)."""

from __future__ import annotations

import numpy as np

from engine.audio.pcm import to_float_mono, to_s16


def s16_to_float(data: bytes) -> np.ndarray:
    """Interleaved signed 16-bit little-endian samples as float32 in [-1, 1)."""
    return to_float_mono(np.frombuffer(data, dtype="<i2"))


def float_to_s16(samples: np.ndarray) -> bytes:
    """float32 samples (clipped to [-1, 1]) as signed 16-bit little-endian bytes."""
    return to_s16(samples)

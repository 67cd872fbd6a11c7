"""The 16-bit PCM that voice-agent frameworks carry, to and from the engine's float32 samples."""

from __future__ import annotations

import numpy as np


def s16_to_float(data: bytes) -> np.ndarray:
    """Interleaved signed 16-bit little-endian samples as float32 in [-1, 1)."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def float_to_s16(samples: np.ndarray) -> bytes:
    """float32 samples (clipped to [-1, 1]) as signed 16-bit little-endian bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()

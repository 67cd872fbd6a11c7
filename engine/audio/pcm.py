"""Normalise PCM from any common source to the engine's one audio format: 16 kHz mono float32.

Accepted samples: ``int16`` (full scale 32768), ``int32`` (full scale 2**31), ``float32`` or
``float64`` (full scale 1.0, taken as they are). Accepted shapes: ``(N,)`` mono, or a 2-D
block with one channel axis. **Channel-axis rule** for 2-D blocks: when the channel count is
given, the axis of that length holds the channels (the last axis if both match); when it is
not, the shorter axis does (the last axis on a tie). So ``(N, C)`` interleaved and ``(C, N)``
planar both work, as long as a block holds more frames than channels or the count is given.
Channels are downmixed by their mean; resampling uses soxr (high quality).
"""

from __future__ import annotations

import math

import numpy as np
import soxr

from engine.timebase import MAX_INPUT_RATE, MIN_INPUT_RATE, SAMPLE_RATE

MAX_CHANNELS = 8
_QUALITY = "HQ"
_FULL_SCALE = {np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2147483648.0}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


class PcmError(ValueError):
    """PCM input that cannot be turned into 16 kHz mono float32."""


def check_rate(sample_rate: float) -> int:
    """Return the sample rate as an int, or raise if it is not a whole number of Hz in a sane range."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float, np.integer, np.floating)):
        raise PcmError(f"sample_rate must be a number of Hz, got {type(sample_rate).__name__}")
    if isinstance(sample_rate, (float, np.floating)) and not (math.isfinite(sample_rate) and sample_rate.is_integer()):
        raise PcmError(f"sample_rate must be a whole number of Hz, got {sample_rate!r}")
    rate = int(sample_rate)  # a Python int of any size: numpy's isfinite refused ints beyond 64 bits
    if not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
        shown = rate if rate.bit_length() <= 64 else "over 2**64"
        raise PcmError(
            f"sample_rate {shown} Hz is outside {MIN_INPUT_RATE}..{MAX_INPUT_RATE} Hz; pass the rate in Hz (e.g. 48000)"
        )
    return rate


def channel_axis(shape: tuple[int, ...], channels: int | None = None) -> int:
    """Which axis of a 2-D PCM block holds the channels (see the module docstring for the rule)."""
    if len(shape) != 2:
        raise PcmError(f"a multichannel PCM block must be 2-D, got shape {shape}")
    if channels is None:
        axis = 0 if shape[0] < shape[1] else 1
    elif shape[1] == channels:
        axis = 1
    elif shape[0] == channels:
        axis = 0
    else:
        raise PcmError(f"PCM block of shape {shape} has no axis of length {channels} (the stream's channel count)")
    if shape[axis] > MAX_CHANNELS:
        raise PcmError(
            f"PCM block of shape {shape} would have {shape[axis]} channels (more than {MAX_CHANNELS}); "
            "pass (frames, channels) or (channels, frames) with more frames than channels"
        )
    return axis


def to_float_mono(pcm: np.ndarray, channels: int | None = None) -> np.ndarray:
    """Scale integer or float PCM to float32 in full-scale units and downmix channels by their mean."""
    if not isinstance(pcm, np.ndarray):
        raise PcmError(
            f"PCM must be a numpy array, got {type(pcm).__name__}; convert with np.asarray(..., dtype=np.int16 or "
            "np.float32)"
        )
    if pcm.dtype in _FULL_SCALE:
        samples = pcm.astype(np.float32) / np.float32(_FULL_SCALE[pcm.dtype])
    elif pcm.dtype in _FLOATS:
        samples = pcm.astype(np.float32, copy=False)
    else:
        raise PcmError(f"PCM dtype {pcm.dtype} is not supported; use int16, int32, float32 or float64")
    if samples.ndim == 1:
        if channels not in (None, 1):
            raise PcmError(f"got 1-D (mono) PCM for a stream of {channels} channels; pass a 2-D block")
    elif samples.ndim == 2:
        samples = samples.mean(axis=channel_axis(samples.shape, channels), dtype=np.float32)
    else:
        raise PcmError(f"PCM must have shape (N,), (N, C) or (C, N), got {pcm.shape}")
    bad = ~np.isfinite(samples)
    if bad.any():
        raise PcmError(
            f"PCM holds {int(bad.sum())} NaN/inf value(s) (first at sample {int(np.argmax(bad))}); "
            "clean the signal before pushing it"
        )
    return np.ascontiguousarray(samples)


def to_s16(samples: np.ndarray) -> bytes:
    """float32 samples (clipped to [-1, 1]) as signed 16-bit little-endian bytes: what voice-agent frameworks carry."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def to_mono_16k(pcm: np.ndarray, sample_rate: float, channels: int | None = None) -> np.ndarray:
    """Convert a whole PCM signal to 16 kHz mono float32 (one-shot)."""
    rate = check_rate(sample_rate)
    mono = to_float_mono(pcm, channels)
    if mono.size == 0:
        raise PcmError("PCM is empty (0 samples); pass at least one sample")
    if rate == SAMPLE_RATE:
        return mono
    return soxr.resample(mono, rate, SAMPLE_RATE, quality=_QUALITY)


class StreamingResampler:
    """Turn pushes of any size at one input rate and channel count into mono float32 at ``target_rate``.

    The concatenated output of all pushes plus ``flush()`` equals the one-shot soxr resampling of
    the whole signal (soxr keeps its filter state between pushes); 16 kHz by default, the model's rate.
    """

    def __init__(self, sample_rate: float, channels: int = 1, target_rate: int = SAMPLE_RATE) -> None:
        if isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= MAX_CHANNELS:
            raise PcmError(f"channels must be an int in 1..{MAX_CHANNELS}, got {channels!r}")
        self.sample_rate = check_rate(sample_rate)
        self.channels = channels
        self.target_rate = check_rate(target_rate)
        self._stream = (
            None
            if self.sample_rate == self.target_rate
            else soxr.ResampleStream(self.sample_rate, self.target_rate, 1, dtype="float32", quality=_QUALITY)
        )

    def push(self, pcm: np.ndarray) -> np.ndarray:
        """Feed the next block; returns the 16 kHz samples that are ready (possibly none)."""
        mono = to_float_mono(pcm, self.channels)
        if self._stream is None:
            return mono
        return self._stream.resample_chunk(mono)

    def flush(self) -> np.ndarray:
        """End of stream: return the samples the resampler still holds, then start afresh."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self._stream.clear()
        return tail

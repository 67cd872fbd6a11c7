"""A render job's audio: an uploaded file's bytes (or a file of the operator's audio folder) -> 16 kHz mono PCM.

Only the formats a render takes are opened, each by its own demuxer, chosen from the file's first bytes: FFmpeg never
probes an upload (its probe would pick playlist and concatenation demuxers that open other files and URLs). The
duration is bounded while decoding, so a long file costs no more than the bound to refuse.
"""

from __future__ import annotations

import io

import av
import numpy as np

from engine.timebase import SAMPLE_RATE

FORMATS = {"wav": "WAV", "flac": "FLAC", "mp3": "MP3", "ogg": "Ogg (Opus, Vorbis)"}
"""The demuxers a render job's audio may be read with, and what the errors call them."""


class AudioRefused(ValueError):
    """A render job's audio cannot be taken; ``status``: 413 too big or too long, 415 not audio of a known format."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def sniff(head: bytes) -> str | None:
    """The demuxer for a file starting with ``head`` (its first bytes), None for anything else."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def decode_clip(data: bytes, max_seconds: float) -> np.ndarray:
    """The speech in ``data`` as 16 kHz mono float32; AudioRefused naming what is wrong (format, no audio, length)."""
    demuxer = sniff(data[:16])
    if demuxer is None:
        raise AudioRefused(f"the body is not audio of a format a render takes ({', '.join(FORMATS.values())})", 415)
    limit = int(max_seconds * SAMPLE_RATE)
    parts, total = [], 0
    try:
        with av.open(io.BytesIO(data), format=demuxer) as container:
            if not container.streams.audio:
                raise AudioRefused(f"the {FORMATS[demuxer]} file holds no audio stream", 415)
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    samples = out.to_ndarray().reshape(-1)
                    total += samples.size
                    if total > limit:
                        raise AudioRefused(f"the audio is longer than this service renders ({max_seconds:g} s)", 413)
                    parts.append(samples)
            parts += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    except av.error.FFmpegError as exc:
        raise AudioRefused(f"cannot decode the {FORMATS[demuxer]} file: {exc}", 415) from exc
    pcm = np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)
    if pcm.size > limit:
        raise AudioRefused(f"the audio is longer than this service renders ({max_seconds:g} s)", 413)
    if pcm.size < SAMPLE_RATE // 25:
        raise AudioRefused(f"the {FORMATS[demuxer]} file holds no audio (under one frame's 40 ms)", 415)
    return pcm

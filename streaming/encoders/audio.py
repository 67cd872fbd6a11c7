"""Audio encoding from the frames' own 48 kHz samples: fixed-size blocks, Opus for WebRTC, AAC inside muxers.

Timestamps come from the sample count only: block k of size n starts at sample k * n.
Opus is encoded once per session output and its packets shared by every viewer; AAC is
encoded by each muxer (RTMP connection, MP4 file) through its own stream, which keeps each
connection's audio timeline aligned with the keyframe it started on (see sinks/mux.py).
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np

from streaming.frames import AUDIO_RATE

OPUS_BLOCK = 960  # 20 ms, the WebRTC norm
OPUS_BITRATE = 64_000
AAC_BLOCK = 1024
AAC_BITRATE = 128_000
LAYOUTS = {1: "mono", 2: "stereo"}


class AudioBlocks:
    """Cut mono float32 samples arriving in any sizes into ``size``-sample ``av.AudioFrame``s of ``channels`` channels
    (stereo carries the voice in both: ingest servers and players expect two channels)."""

    def __init__(self, size: int, rate: int = AUDIO_RATE, channels: int = 1) -> None:
        if channels not in LAYOUTS:
            raise ValueError(f"audio has 1 or 2 channels, got {channels}")
        self.size, self.rate, self.channels = size, rate, channels
        self._pending = np.zeros(0, np.float32)
        self._next_pts = 0

    def push(self, samples: np.ndarray) -> list[av.AudioFrame]:
        """The whole blocks now available."""
        self._pending = np.concatenate((self._pending, np.asarray(samples, np.float32).reshape(-1)))
        whole = self._pending.size // self.size * self.size
        blocks, self._pending = self._pending[:whole], self._pending[whole:]
        return [self._frame(blocks[i : i + self.size]) for i in range(0, whole, self.size)]

    def flush(self, pad: bool) -> list[av.AudioFrame]:
        """The remainder as one last block, zero-padded to full size when ``pad``."""
        rest, self._pending = self._pending, np.zeros(0, np.float32)
        if rest.size == 0:
            return []
        return [self._frame(np.pad(rest, (0, self.size - rest.size)) if pad else rest)]

    def skip_to(self, sample: int) -> list[av.AudioFrame]:
        """Close the partial block (zero-padded) and continue at ``sample``: a gap in the input, kept in the
        timeline."""
        frames = self.flush(pad=True)
        self._next_pts = max(sample, self._next_pts)
        return frames

    def _frame(self, block: np.ndarray) -> av.AudioFrame:
        planes = np.repeat(np.ascontiguousarray(block)[None], self.channels, axis=0)
        layout = LAYOUTS[self.channels]
        frame = av.AudioFrame.from_ndarray(planes, format="flt" if self.channels == 1 else "fltp", layout=layout)
        frame.sample_rate = self.rate
        frame.pts = self._next_pts
        frame.time_base = Fraction(1, self.rate)
        self._next_pts += block.size
        return frame


class OpusEncoder:
    """48 kHz mono Opus in 20 ms packets (pts in samples), for WebRTC viewers."""

    def __init__(self, bitrate: int = OPUS_BITRATE) -> None:
        context = av.CodecContext.create("libopus", "w")
        context.sample_rate = AUDIO_RATE
        context.layout = "mono"
        context.format = "flt"
        context.bit_rate = bitrate
        context.time_base = Fraction(1, AUDIO_RATE)
        context.options = {"application": "lowdelay", "frame_duration": "20"}
        context.open()
        self._context = context
        self._blocks = AudioBlocks(OPUS_BLOCK)

    def encode(self, samples: np.ndarray) -> list[av.Packet]:
        """Packets for the 20 ms blocks these samples complete."""
        return [p for frame in self._blocks.push(samples) for p in self._context.encode(frame)]

    def flush(self) -> list[av.Packet]:
        """The last (zero-padded) block and whatever the encoder still holds."""
        packets = [p for frame in self._blocks.flush(pad=True) for p in self._context.encode(frame)]
        return packets + list(self._context.encode(None))

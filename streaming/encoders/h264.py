"""What every H.264 encoder here shares: live settings, the level for a frame size, Annex-B parsing, keyframe requests.

Live output is one bitstream for every sink (RTMP, WebRTC, MP4), so it is shaped for the
strictest of them: Constrained Baseline (what browsers negotiate for WebRTC, profile-level-id
42e01f, and accepted by every broadcast ingest), no B-frames (zero reordering delay), an IDR
at least every 2 s (broadcast servers require <= 2 s keyframe intervals), SPS/PPS repeated in
front of every IDR so a viewer or a reconnected server can start at any keyframe, and Annex-B
start codes (what RTP packetisation wants; the FLV and MP4 muxers convert on the way in).
A session's output settings (``streaming.output_settings``) may ask for Main or High instead, CBR, and
another keyframe interval: broadcast ingest wants High at a constant bitrate.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engine.timebase import FPS

NAL_IDR = 5
NAL_SPS = 7
NAL_PPS = 8
# (level, max macroblocks per frame, max macroblocks per second, MaxCPB in kbit) from H.264 Table A-1.
_LEVELS = (
    (3.1, 3600, 108_000, 14_000),
    (3.2, 5120, 216_000, 20_000),
    (4.0, 8192, 245_760, 25_000),
    (4.2, 8704, 522_240, 62_500),
    (5.1, 36_864, 983_040, 240_000),
)
PROFILES = ("baseline", "main", "high")
HIGH_RATE_FACTOR = 1.25
"""High profile's cpbBrVclFactor over Baseline/Main's (1250 vs 1000 bits per MaxBR unit, Table A-2)."""


@dataclass(frozen=True)
class H264Settings:
    """Encoder settings; ``bitrate`` None picks 0.1 bit per pixel per frame (about 2.3 Mbit/s at 720p25).

    ``buffer``: the VBV buffer in bits (None: one second at the bitrate); ``cbr``: constant bitrate with filler and
    HRD timing in the stream (what broadcast ingest expects), else the bitrate is an average capped by the VBV;
    ``tune``: x264's psy tune, always combined with zerolatency (each frame's packet comes back at once)."""

    bitrate: int | None = None
    keyframe_seconds: float = 2.0
    preset: str = "ultrafast"
    crf: int | None = None
    threads: int = 0
    profile: str = "baseline"
    tune: str = "zerolatency"
    buffer: int | None = None
    cbr: bool = False

    def bitrate_for(self, width: int, height: int) -> int:
        """Target bits per second for this frame size."""
        return self.bitrate or max(300_000, round(width * height * FPS * 0.1))

    def buffer_for(self, width: int, height: int) -> int:
        """The VBV buffer in bits for this frame size."""
        return self.buffer or self.bitrate_for(width, height)

    @property
    def gop(self) -> int:
        """Frames between scheduled IDRs."""
        return max(1, round(self.keyframe_seconds * FPS))


@dataclass(frozen=True)
class EncodedVideo:
    """One access unit in Annex-B form, for the session frame ``index``."""

    index: int
    data: bytes
    keyframe: bool


def level_for(width: int, height: int, fps: int = FPS) -> float:
    """The lowest H.264 level (3.1 at least: WebRTC's 42e01f) that allows this frame size and rate."""
    mbs = ((width + 15) // 16) * ((height + 15) // 16)
    for level, max_fs, max_mbps, _ in _LEVELS:
        if mbs <= max_fs and mbs * fps <= max_mbps:
            return level
    raise ValueError(f"{width}x{height} at {fps} fps is beyond H.264 level 5.1")


def max_buffer(level: float, profile: str) -> int:
    """The largest VBV buffer in bits that ``level`` allows ``profile`` (High: 1.25 times Baseline's and Main's)."""
    factor = 1000 * (HIGH_RATE_FACTOR if profile == "high" else 1)
    for known, _, _, max_cpb in _LEVELS:
        if known == level:
            return round(max_cpb * factor)
    raise ValueError(f"unknown H.264 level {level}")


def nal_units(data: bytes) -> list[bytes]:
    """The NAL units of an Annex-B byte string (start codes and trailing zero bytes removed)."""
    units = []
    pos = data.find(b"\x00\x00\x01")
    while pos >= 0:
        following = data.find(b"\x00\x00\x01", pos + 3)
        unit = data[pos + 3 : len(data) if following < 0 else following].rstrip(b"\x00")
        if unit:
            units.append(unit)
        pos = following
    return units


def nal_types(data: bytes) -> list[int]:
    """The nal_unit_type of each NAL unit in an Annex-B byte string."""
    return [unit[0] & 0x1F for unit in nal_units(data)]


def is_idr(data: bytes) -> bool:
    """Whether an Annex-B access unit holds an IDR slice (a point where decoding can start)."""
    return NAL_IDR in nal_types(data)


class KeyframeRequests:
    """Thread-safe "make the next frame an IDR", coalesced and at most one forced IDR per ``min_seconds``.

    New WebRTC viewers, browser PLI/FIR and reconnected RTMP outputs all ask for one; a burst of
    requests costs a single IDR, and one that arrives too soon after the last forced IDR waits
    (it is never lost), so a storm of PLIs cannot turn the stream into all-intra frames.
    """

    def __init__(self, min_seconds: float = 0.5) -> None:
        self._min_frames = max(1, round(min_seconds * FPS))
        self._lock = threading.Lock()
        self._pending = False
        self._last_forced: int | None = None
        self.forced = 0

    def request(self) -> None:
        """Ask for an IDR as soon as allowed."""
        with self._lock:
            self._pending = True

    def take(self, index: int) -> bool:
        """Whether frame ``index`` must be a forced IDR (consumes the request)."""
        with self._lock:
            if not self._pending:
                return False
            if self._last_forced is not None and index - self._last_forced < self._min_frames:
                return False
            self._pending = False
            self._last_forced = index
            self.forced += 1
            return True

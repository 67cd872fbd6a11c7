"""Read a live RTMP stream back with PyAV in a thread of its own, noting when each frame arrives.

``RtmpPlayer`` decodes everything as a player would (one decoder thread, so no frame-threading
delay): each picture's arrival time and a hash of its luma plane (H.264 decoding is exact, so
the same picture decoded from the WebRTC stream hashes the same), and the marker bursts in
its AAC audio. ``RtmpPacketLog`` only demuxes (no decoding cost, for many streams at once) and
keeps every packet's timestamp and arrival time. Both are opened before the publisher starts:
nginx holds the player until then, and the reader sees the stream from its first frame.
nginx sends no end of stream to a live player, so reads end on a read timeout (or when nginx stops).
Opening probes only 0.1 s of the stream (FFmpeg's default is 5 s, which a slow CPU stream takes
minutes to fill): nginx sends the H.264 and AAC headers first, so both streams are found in it.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from dataclasses import dataclass, field

import av
import numpy as np

from engine.timebase import FPS
from harness.markers import AAC_PRIMING, Onset, OnsetDetector
from streaming.encoders.audio import AAC_BLOCK
from streaming.frames import AUDIO_RATE

OPEN_OPTIONS = {"rtmp_live": "live", "analyzeduration": "100000"}


def luma_hash(frame: av.VideoFrame) -> str:
    """A hash of a decoded picture's luma plane (its visible part)."""
    plane = frame.planes[0]
    rows = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[: frame.height, : frame.width]
    return hashlib.blake2b(np.ascontiguousarray(rows).tobytes(), digest_size=8).hexdigest()


class ArrivalLog:
    """When stretches of a timeline arrived: (start time on the timeline, arrival), in timeline order."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._arrivals: list[float] = []

    def add(self, start: float, arrival: float) -> None:
        self._starts.append(start)
        self._arrivals.append(arrival)

    def arrival(self, time_on_timeline: float) -> float | None:
        """Arrival of the stretch holding this time (None before the first)."""
        i = bisect.bisect_right(self._starts, time_on_timeline) - 1
        return self._arrivals[i] if i >= 0 else None


@dataclass
class Picture:
    """A decoded picture: its frame number on the stream's timeline, when it was decoded, its luma hash."""

    number: int
    arrival: float
    luma: str


@dataclass
class PlayerLog:
    """What an RtmpPlayer saw."""

    pictures: dict[int, Picture] = field(default_factory=dict)
    onsets: list[tuple[Onset, float]] = field(default_factory=list)
    size: tuple[int, int] | None = None
    first_picture_at: float | None = None
    error: str | None = None


class RtmpPlayer:
    """Decode ``url`` live: pictures with arrival times and luma hashes, marker onsets (AAC delay removed)."""

    def __init__(self, url: str, open_timeout: float, read_timeout: float = 5.0) -> None:
        self.url, self.open_timeout, self.read_timeout = url, open_timeout, read_timeout
        self.log = PlayerLog()
        self._audio = ArrivalLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtmp-player", daemon=True)

    def start(self) -> RtmpPlayer:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> PlayerLog:
        """Stop at the next packet (or the read timeout) and return what was seen."""
        self._stop.set()
        self._thread.join(timeout)
        return self.log

    def _run(self) -> None:
        detector = OnsetDetector(AUDIO_RATE)
        priming = AAC_PRIMING / AUDIO_RATE
        try:
            with av.open(
                self.url, format="flv", timeout=(self.open_timeout, self.read_timeout), options=OPEN_OPTIONS
            ) as container:
                video = container.streams.video[0]
                video.codec_context.thread_count = 1
                for packet in container.demux():
                    if self._stop.is_set():
                        break
                    for frame in packet.decode():
                        now = time.monotonic()
                        if packet.stream is video:
                            number = round(float(frame.pts * frame.time_base) * FPS)
                            self.log.pictures[number] = Picture(number, now, luma_hash(frame))
                            self.log.size = (frame.width, frame.height)
                            if self.log.first_picture_at is None:
                                self.log.first_picture_at = now
                        else:
                            start = float(frame.pts * frame.time_base) - priming
                            self._audio.add(start, now)
                            for onset in detector.feed(first_channel(frame), start):
                                self.log.onsets.append((onset, self._audio.arrival(onset.time) or now))
        except av.error.FFmpegError as exc:  # the live read ends on its timeout: nginx sends no end of stream
            self.log.error = f"{type(exc).__name__}: {exc}"


def first_channel(frame: av.AudioFrame) -> np.ndarray:
    """A decoded audio frame's first channel (the voice is in every channel of a stereo stream)."""
    samples = frame.to_ndarray()
    return samples[0] if frame.format.is_planar else samples.reshape(-1)[:: len(frame.layout.channels)]


@dataclass
class PacketLog:
    """Every video and audio packet of one stream: timeline position (s) and arrival (monotonic s)."""

    video: list[tuple[float, float]] = field(default_factory=list)
    audio_end: list[tuple[float, float]] = field(default_factory=list)
    error: str | None = None


class RtmpPacketLog:
    """Demux ``url`` live without decoding and log every packet's timestamp and arrival."""

    def __init__(self, url: str, open_timeout: float, read_timeout: float = 5.0) -> None:
        self.url, self.open_timeout, self.read_timeout = url, open_timeout, read_timeout
        self.log = PacketLog()
        self._thread = threading.Thread(target=self._run, name=f"rtmp-log {url}", daemon=True)

    def start(self) -> RtmpPacketLog:
        self._thread.start()
        return self

    def join(self, timeout: float) -> PacketLog:
        """Wait for the read to end (the stream stopped and the read timed out)."""
        self._thread.join(timeout)
        return self.log

    def _run(self) -> None:
        try:
            with av.open(
                self.url, format="flv", timeout=(self.open_timeout, self.read_timeout), options=OPEN_OPTIONS
            ) as container:
                for packet in container.demux():
                    if packet.pts is None or packet.size == 0:
                        continue
                    now = time.monotonic()
                    start = float(packet.pts * packet.time_base)
                    if packet.stream.type == "video":
                        self.log.video.append((start, now))
                    else:
                        self.log.audio_end.append((start + AAC_BLOCK / AUDIO_RATE, now))
        except av.error.FFmpegError as exc:
            self.log.error = f"{type(exc).__name__}: {exc}"

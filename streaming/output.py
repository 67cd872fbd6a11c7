"""One session's output: pull its frames, encode each once, release them at their pts, fan out to every sink.

Encode once, fan out: the H.264 bitstream is identical for RTMP (FLV), the WebRTC viewers
(RTP) and MP4, so it is encoded once per session output (the expensive part, and NVENC
sessions are a scarce resource). Opus is encoded once and shared by all viewers. AAC is
encoded per muxer (cheap: about 1% of a core), so each RTMP connection, including one made
after a reconnect, starts its audio timeline on the keyframe its video starts on.

Two threads: the encode thread takes frames as the session makes them (a little ahead of real
time) and encodes them at once; the release thread hands each encoded frame to every sink at
``anchor + pts`` (one pacer, absolute deadlines). The anchor is the session's own live clock
(the time by which the runtime has each frame ready) plus ``playout_delay``, the allowance for
encoding: starting a second clock when the first frame arrives would add its offset to the
latency of everything that follows. Sinks never block the release thread: each one queues and
drops on its own, so a stalled viewer or a dead RTMP server slows nobody else.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import numpy as np
import torch

from streaming.clock import Pacer
from streaming.encoders.audio import OpusEncoder
from streaming.encoders.h264 import EncodedVideo, H264Settings
from streaming.encoders.select import VideoEncoder, open_video_encoder
from streaming.frames import FPS, FrameLike, FrameSource

log = logging.getLogger(__name__)
RELEASE_QUEUE_FRAMES = 5 * FPS
PLAYOUT_DELAY = 0.01
"""Seconds after the session's clock shows a frame that outputs release it: time to encode it."""


@dataclass(frozen=True)
class EncodedFrame:
    """Frame ``index`` encoded: its H.264 access unit, its own audio (48 kHz float32) and that audio as Opus."""

    index: int
    width: int
    height: int
    video: bytes
    keyframe: bool
    audio: np.ndarray
    opus: tuple[tuple[int, bytes], ...]
    speech: bool

    @property
    def pts(self) -> Fraction:
        """Seconds from the session start, from the index alone."""
        return Fraction(self.index, FPS)


class Sink(Protocol):
    """Something that takes encoded frames at their release time; ``send`` must never block."""

    name: str

    def send(self, frame: EncodedFrame) -> None: ...

    def close(self) -> None: ...

    def stats(self) -> dict[str, int | float]: ...


@dataclass
class OutputStats:
    """Counters of one session output (read by /metrics)."""

    frames_in: int = 0
    frames_released: int = 0
    late_releases: int = 0
    encode_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=10 * 60 * FPS))


def confine_torch_threads() -> None:
    """One intra-op torch thread for the calling thread only (the encode thread's small per-frame ops).

    On a CPU-only machine torch's OpenMP threads for a per-frame colour conversion contend with
    the runtime and the encoder itself: measured p99 300 ms per frame with 2 threads against
    50 ms with 1 on a loaded 2-core machine. ``torch.set_num_threads`` sets the calling thread's
    count and also the default for threads initialised later; a short-lived thread puts the
    default back, so no other thread is affected.
    """
    default = torch.get_num_threads()
    torch.set_num_threads(1)
    restore = threading.Thread(target=torch.set_num_threads, args=(default,))
    restore.start()
    restore.join()


class SessionOutput:
    """Drive one session's frames through one encoder to any number of sinks, added or removed at any time.

    ``playout_delay``: seconds after the session's clock shows a frame (after the first frame arrived,
    for a source without a clock) that it is released: time to encode it.
    """

    def __init__(
        self,
        session: FrameSource,
        encoder: str = "auto",
        settings: H264Settings | None = None,
        playout_delay: float = PLAYOUT_DELAY,
        name: str = "0",
    ) -> None:
        self.session, self.name = session, name
        self.encoder_kind, self.settings = encoder, settings
        self.encoder: VideoEncoder | None = None
        self.encoder_note = ""
        self.stats = OutputStats()
        self.pacer = Pacer(delay=playout_delay)
        self._sinks: tuple[Sink, ...] = ()
        self._lock = threading.Lock()
        self._released: queue.Queue[EncodedFrame | None] = queue.Queue(RELEASE_QUEUE_FRAMES)
        self._stop = threading.Event()
        self._opus = OpusEncoder()
        self._threads = (
            threading.Thread(target=self._encode_loop, name=f"encode-{name}", daemon=True),
            threading.Thread(target=self._release_loop, name=f"release-{name}", daemon=True),
        )
        self.finished = threading.Event()

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks now attached."""
        return self._sinks

    def add_sink(self, sink: Sink) -> None:
        """Attach a sink; it receives frames from the next release on."""
        with self._lock:
            self._sinks = (*self._sinks, sink)

    def remove_sink(self, sink: Sink) -> None:
        """Detach a sink (it is not closed)."""
        with self._lock:
            self._sinks = tuple(s for s in self._sinks if s is not sink)

    def request_keyframe(self) -> None:
        """Make an upcoming frame an IDR (a new viewer, a PLI, a reconnected server)."""
        if self.encoder is not None:
            self.encoder.keyframes.request()

    def start(self) -> SessionOutput:
        """Start pulling, encoding and releasing."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop pulling frames, close every sink and wait for the threads (idempotent)."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    def encode_ms(self, quantile: float) -> float:
        """A quantile of the recent per-frame encode times, in milliseconds (0 before the first frame)."""
        times = self.stats.encode_seconds
        return float(np.quantile(np.fromiter(times, float), quantile)) * 1000 if times else 0.0

    # -- encode thread --------------------------------------------------------------------

    def _encode_loop(self) -> None:
        confine_torch_threads()
        pending: deque[tuple[FrameLike, tuple[tuple[int, bytes], ...]]] = deque()
        try:
            while not self._stop.is_set():
                try:
                    frame = self.session.next_frame(timeout=0.2)
                except TimeoutError:
                    continue
                if frame is None:
                    break
                self.stats.frames_in += 1
                started = time.perf_counter()
                encoder = self.encoder or self._open_encoder(frame.image)
                packets = encoder.encode(frame.image, frame.index, frame.ready)
                opus = tuple((int(p.pts), bytes(p)) for p in self._opus.encode(frame.audio))
                self.stats.encode_seconds.append(time.perf_counter() - started)
                pending.append((frame, opus))
                self._match(packets, pending)
            if self.encoder is not None:
                self._match(self.encoder.flush(), pending)
        except Exception:
            log.exception("output %s: encoding failed; the output stops", self.name)
        finally:
            self._put(None)

    def _open_encoder(self, image: torch.Tensor) -> VideoEncoder:
        height, width = image.shape[:2]
        self.encoder, self.encoder_note = open_video_encoder(self.encoder_kind, width, height, image.device, self.settings)
        log.info("output %s: %s", self.name, self.encoder_note)
        return self.encoder

    def _match(self, packets: list[EncodedVideo], pending: deque) -> None:
        """Pair each access unit with its frame (an encoder with output delay returns older frames' units)."""
        for packet in packets:
            while pending and pending[0][0].index < packet.index:
                log.warning("output %s: the encoder returned no picture for frame %d", self.name, pending.popleft()[0].index)
            if not pending or pending[0][0].index != packet.index:
                log.warning("output %s: dropping an access unit for unknown frame %d", self.name, packet.index)
                continue
            frame, opus = pending.popleft()
            height, width = frame.image.shape[:2]
            self._put(EncodedFrame(frame.index, width, height, packet.data, packet.keyframe, frame.audio, opus, frame.speech))

    def _put(self, item: EncodedFrame | None) -> None:
        """Queue for release; once stopping, frames that do not fit are let go (the end marker always goes)."""
        while True:
            try:
                self._released.put(item, timeout=0.2)
                return
            except queue.Full:
                if self._stop.is_set() and item is not None:
                    return

    # -- release thread -------------------------------------------------------------------

    def _release_loop(self) -> None:
        try:
            while True:
                item = self._released.get()
                if item is None:
                    break
                if self._stop.is_set():
                    continue
                late = self.pacer.wait(float(item.pts), self.session.clock_anchor)
                if late > 1 / FPS:
                    self.stats.late_releases += 1
                for sink in self._sinks:
                    try:
                        sink.send(item)
                    except Exception:
                        log.exception("output %s: sink %s failed; it is detached", self.name, sink.name)
                        self.remove_sink(sink)
                self.stats.frames_released += 1
        finally:
            for sink in self._sinks:
                try:
                    sink.close()
                except Exception:
                    log.exception("output %s: closing sink %s failed", self.name, sink.name)
            self.finished.set()

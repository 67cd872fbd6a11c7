"""RTMP sink: FLV (H.264 + AAC 48 kHz, constant 25 fps) to an rtmp:// server, surviving server drops and restarts.

The sink has its own thread and a bounded queue, so a slow or dead server never holds up
the output. When a write fails (the server dropped or restarted) the connection is closed
and re-opened with exponential backoff and jitter, as broadcast encoders do (first retry
after about 2 s, then 4, 8, ... up to a cap, a bounded number of attempts). Frames keep
flowing meanwhile and are dropped (counted). Every connection starts on an IDR, requested
from the shared encoder, with its own timeline from 0 (see mux.py), so video and audio
stay in order and in sync after a reconnect. Its stats say where it is (``state``: connecting, connected,
reconnecting, failed), why it last lost the server (``error``) and when it tries again (``retry_in_s``): what the
session's state shows under ``sinks``.

The connection is FFmpeg's RTMP client opened without holding the GIL (``rtmp_io``): connecting
never stalls the other threads of the process (the other streams of an output worker), and a
server that stops answering fails a write after ``io_timeout`` seconds, which counts as a drop. Once it gives up,
its next ``send`` raises ``SinkFailed``, so the output reports it as it reports a failed recording.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.timebase import FPS
from streaming.fanout import SinkFailed
from streaming.frames import EncodedFrame
from streaming.sinks.mux import Muxer
from streaming.sinks.rtmp_io import RtmpConnection
from streaming.targets import check_rtmp_url, masked_rtmp_url

log = logging.getLogger(__name__)
_CLOSE = object()
IO_TIMEOUT = 5.0
"""Seconds a network read or write of the connection (its connect included) may block before the sink reconnects."""


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays: ``first`` seconds, times ``factor`` each attempt up to ``cap``, +-``jitter`` relative."""

    first: float = 2.0
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2
    attempts: int = 20

    def delays(self, rng: random.Random) -> Iterator[float]:
        """The wait before each attempt, ``attempts`` of them."""
        delay = self.first
        for _ in range(self.attempts):
            yield delay * (1 + rng.uniform(-self.jitter, self.jitter))
            delay = min(delay * self.factor, self.cap)


class RtmpSink:
    """Publish the released frames to ``url`` (AAC of ``audio_channels`` channels); reconnects on its own, gives up
    after the backoff's attempts."""

    name = "rtmp"

    def __init__(
        self,
        url: str,
        request_keyframe: Callable[[], None],
        backoff: Backoff | None = None,
        queue_seconds: float = 2.0,
        seed: int | None = None,
        io_timeout: float = IO_TIMEOUT,
        audio_channels: int = 1,
    ) -> None:
        self.url, self.io_timeout = check_rtmp_url(url), io_timeout
        self.audio_channels = audio_channels
        self.shown = masked_rtmp_url(url)
        """The URL as logs and failure messages show it: without its stream key."""
        self.backoff = backoff or Backoff()
        self._request_keyframe = request_keyframe
        self._rng = random.Random(seed)
        self._queue: queue.Queue = queue.Queue(max(1, round(queue_seconds * FPS)))
        self._muxer: Muxer | None = None
        self._connection: RtmpConnection | None = None
        self._delays: Iterator[float] | None = None
        self._retry_at = 0.0
        self.connected = threading.Event()
        self.gave_up = False
        self.state = "connecting"
        """``connecting`` (the first connection), ``connected``, ``reconnecting`` (lost or not reached: waiting for the
        next attempt) or ``failed`` (gave up after the backoff's attempts)."""
        self.error: str | None = None
        """Why the last connection was lost or an attempt failed (the URL without its key); None while connected."""
        self._failure: str | None = None
        self.connections = 0
        self.reconnects = 0
        self.failed_attempts = 0
        self.frames_sent = 0
        self.frames_dropped = 0
        self.overflow_dropped = 0
        self._thread = threading.Thread(target=self._run, name="rtmp", daemon=True)
        self._thread.start()

    def send(self, frame: EncodedFrame) -> None:
        """Queue a frame; when the queue is full the oldest is dropped and the stream resumes at an IDR. SinkFailed,
        once, when the sink has given up on the server."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise SinkFailed(failure)
        try:
            self._queue.put_nowait(frame)
        except queue.Full:
            self.overflow_dropped += self._drain()
            self._queue.put_nowait(frame)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, close the connection and stop the thread."""
        while True:
            try:
                self._queue.put(_CLOSE, timeout=0.1)
                break
            except queue.Full:
                self.overflow_dropped += self._drain()
        self._thread.join(timeout)

    def stats(self) -> dict[str, int | float | str | None]:
        """Frames sent and dropped, connections made, reconnects and failed attempts; the state, the last error, and
        while reconnecting the seconds until the next attempt."""
        retry = max(0.0, self._retry_at - time.monotonic()) if self.state == "reconnecting" else None
        return {
            "frames_sent": self.frames_sent,
            "frames_dropped": self.frames_dropped + self.overflow_dropped,
            "connections": self.connections,
            "reconnects": self.reconnects,
            "failed_attempts": self.failed_attempts,
            "connected": int(self.connected.is_set()),
            "state": self.state,
            "error": self.error,
            "retry_in_s": None if retry is None else round(retry, 1),
        }

    def _drain(self) -> int:
        """Empty the queue (keeping a pending close) and ask for an IDR: the muxer resumes on it after the gap."""
        dropped = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _CLOSE:
                self._queue.put_nowait(item)
                break
            dropped += 1
        self._request_keyframe()
        return dropped

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                break
            self._handle(item)
        self._disconnect()

    def _handle(self, frame: EncodedFrame) -> None:
        if self._muxer is None and not self._connect(frame):
            self.frames_dropped += 1
            return
        try:
            written = self._muxer.write(frame)
        except Exception as exc:
            self.frames_dropped += 1
            self._lost(exc)
            return
        if not written:
            self.frames_dropped += 1
            return
        self.frames_sent += 1
        if not self.connected.is_set():
            self.connected.set()
            self.state, self.error = "connected", None
            self.connections += 1
            if self.connections > 1:
                self.reconnects += 1
            self._delays = None
            log.info("rtmp: %s %s", "reconnected to" if self.connections > 1 else "publishing to", self.shown)

    def _connect(self, frame: EncodedFrame) -> bool:
        """Open a connection when one is due; it goes out with the next keyframe."""
        if self.gave_up or time.monotonic() < self._retry_at:
            return False
        try:
            self._connection = RtmpConnection(self.url, self.io_timeout)
            self._muxer = Muxer(self._connection, "flv", frame.width, frame.height, self.audio_channels)
        except Exception as exc:
            self._lost(exc)
            return False
        if not frame.keyframe:
            self._request_keyframe()
        return True

    def _lost(self, exc: Exception) -> None:
        """Close the broken connection and schedule the next attempt (or give up)."""
        was_connected = self.connected.is_set()
        self.connected.clear()
        self._disconnect()
        if not was_connected:
            self.failed_attempts += 1
        if self._delays is None:
            self._delays = self.backoff.delays(self._rng)
        delay = next(self._delays, None)
        reason = str(exc).replace(self.url, self.shown)
        self.error = reason
        if delay is None:
            self._failure = f"gave up on {self.shown} after {self.backoff.attempts} attempts: {reason}"
            self.gave_up, self.state = True, "failed"
            log.error("rtmp: %s", self._failure)
            return
        self._retry_at = time.monotonic() + delay
        self.state = "reconnecting"
        lost = "lost" if was_connected else "cannot reach"
        log.warning("rtmp: %s %s (%s); retrying in %.1f s", lost, self.shown, reason, delay)

    def _disconnect(self) -> None:
        muxer, connection, self._muxer, self._connection = self._muxer, self._connection, None, None
        try:
            if muxer is not None:
                muxer.close()
        except Exception as exc:
            log.debug("rtmp: closing %s: %s", self.shown, exc)
        finally:
            if connection is not None:
                connection.close()

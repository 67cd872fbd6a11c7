"""MP4 file sink: records a live session's shared H.264 stream and its audio (AAC 48 kHz) to a file.

A file has no clock, so frames are written as they are released (already paced by the
output); the file's times come from frame indices, so it plays back at exactly 25 fps.
It starts on a keyframe (asking the encoder for one when it is attached mid-stream).

The sink opens the file itself and hands PyAV a file object, as the RTMP sink hands it its connection: FFmpeg never
opens a URL (so no ``file:``, ``tee:`` or ``pipe:`` target reaches it) and never blocks holding the GIL. The file is
created exclusively and not through a link (``streaming.targets``: a recording replaces nothing; a FIFO or any other
existing name is refused, never opened). Opening and writing run on the sink's own thread behind a bounded queue, so a
target that blocks (a hung network filesystem) holds up no output, and its ``close`` waits CLOSE_SECONDS at most. A
failed open or write (a full disk), or a file not finished by then, ends the recording and is raised once, as
``SinkFailed``, from the next ``send`` or from ``close``: the output reports it.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from engine.timebase import FPS
from streaming.fanout import SinkFailed
from streaming.frames import EncodedFrame
from streaming.sinks.mux import Muxer

log = logging.getLogger(__name__)
_CLOSE = object()
CLOSE_SECONDS = 5.0
"""How long closing waits for the file to be finished: ample for a disk that answers, and within the 10 s a DELETE of
the session waits, so a file system that hangs costs its session that long and is reported, never a 504."""
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
"""A new regular file or nothing: an existing name (a file, a FIFO, a device, a link) fails with EEXIST."""


def create_recording(path: Path) -> BinaryIO:
    """Create ``path`` (and its missing folders) as a new file and open it for writing; OSError if anything is there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(os.open(path, CREATE_FLAGS, 0o644), "wb")


class Mp4Sink:
    """Write the released frames to ``path`` (AAC of ``audio_channels`` channels) until the output closes it."""

    name = "mp4"

    def __init__(
        self,
        path: str | Path,
        request_keyframe: Callable[[], None],
        queue_seconds: float = 4.0,
        audio_channels: int = 1,
        close_seconds: float = CLOSE_SECONDS,
    ) -> None:
        self.path = Path(path)
        self.close_seconds = close_seconds
        self.audio_channels = audio_channels
        self._request_keyframe = request_keyframe
        self._queue: queue.Queue = queue.Queue(max(1, round(queue_seconds * FPS)))
        self._file: BinaryIO | None = None
        self._muxer: Muxer | None = None
        self._asked = False
        self._error: str | None = None
        self._raised = False
        self.frames_sent = 0
        self.frames_dropped = 0
        self._thread = threading.Thread(target=self._run, name="mp4", daemon=True)
        self._thread.start()

    @property
    def error(self) -> str | None:
        """Why the recording ended early (None while it is fine)."""
        return self._error

    def send(self, frame: EncodedFrame) -> None:
        """Queue a frame; SinkFailed once the recording has failed. A full queue is emptied (the file resumes at a
        keyframe)."""
        self._raise_failure()
        try:
            self._queue.put_nowait(frame)
        except queue.Full:
            self.frames_dropped += self._drain() + 1
            self._request_keyframe()

    def close(self) -> None:
        """Finish the file and stop the thread (idempotent); SinkFailed if the recording failed and was not reported,
        or is not finished within ``close_seconds`` (its file system does not answer: the file is incomplete)."""
        while self._thread.is_alive():
            try:
                self._queue.put(_CLOSE, timeout=0.1)
                break
            except queue.Full:
                self.frames_dropped += self._drain()
        self._thread.join(self.close_seconds)
        if self._thread.is_alive() and self._error is None:
            waited = f"{self.close_seconds:g} s"
            self._error = f"recording to {self.path} was not finished within {waited}: its file system does not answer"
            log.error("mp4: %s", self._error)
        self._raise_failure()

    def stats(self) -> dict[str, int | float]:
        """Frames written and dropped."""
        return {"frames_sent": self.frames_sent, "frames_dropped": self.frames_dropped}

    def _raise_failure(self) -> None:
        if self._error is not None and not self._raised:
            self._raised = True
            raise SinkFailed(self._error)

    def _drain(self) -> int:
        """Empty the queue, keeping a pending close; the frames dropped."""
        dropped = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return dropped
            if item is _CLOSE:
                self._queue.put_nowait(item)
                return dropped
            dropped += 1

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not _CLOSE:
                self._write(item)
            self._finish()
        except OSError as exc:
            self._fail(exc)
        except Exception as exc:
            log.exception("mp4: recording to %s failed", self.path)
            self._fail(exc)

    def _write(self, frame: EncodedFrame) -> None:
        if self._muxer is None:
            self._file = create_recording(self.path)
            self._muxer = Muxer(self._file, "mp4", frame.width, frame.height, self.audio_channels)
        if self._muxer.write(frame):
            self.frames_sent += 1
            return
        self.frames_dropped += 1
        if not self._asked:
            self._request_keyframe()
            self._asked = True

    def _finish(self) -> None:
        """Write the trailer and close the file."""
        muxer, file, self._muxer, self._file = self._muxer, self._file, None, None
        try:
            if muxer is not None:
                muxer.close()
        finally:
            if file is not None:
                file.close()
        if file is not None:
            log.info("mp4: wrote %d frames to %s", self.frames_sent, self.path)

    def _fail(self, exc: Exception) -> None:
        """Record why the recording ended and close what is open; the thread ends (``send`` refuses from now on)."""
        if isinstance(exc, FileExistsError):
            self._error = f"{self.path} exists; a recording never replaces anything"
        else:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._error = f"recording to {self.path} failed: {reason}"
        log.error("mp4: %s", self._error)
        try:
            self._finish()
        except Exception as late:
            log.debug("mp4: closing %s after the failure: %s", self.path, late)

"""A render job's file, in the output worker: every frame of its ring, in order, into one MP4 (H.264 + AAC).

A live stream runs an output clock and repeats a picture that comes late; a file has no clock: the job's frames are
written as fast as they come and none is ever repeated or dropped. Each frame is read from its ring slot when its turn
comes and the slot released once the frame is written (``streaming.frame_ring``), so the engine core renders no
further ahead than the ring holds: the GPU's speed, bounded by the encoder's, in bounded memory. The file is created
exclusively (``streaming.sinks.mp4.create_recording``) at the path the service chose in the operator's folder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.timebase import FPS
from engine.trace import trace
from streaming.frame_ring import FrameRing
from streaming.mp4 import Mp4Writer
from streaming.sinks.mp4 import create_recording

log = logging.getLogger(__name__)
PROGRESS_EVERY = FPS
"""Frames between two progress reports (a second of the clip)."""


class RenderFile:
    """Writes render job ``name``'s frames from ``ring`` to ``path`` on a thread of its own; ``progress(frames)`` is
    told as it goes, ``failed(message)`` once if the file cannot be written. Used by the worker as a stream's source
    (``put``, ``end``) and its output (``finished``, ``stop``, ``snapshot``)."""

    def __init__(
        self,
        name: str,
        ring: FrameRing,
        path: str | Path,
        progress: Callable[[int], None],
        failed: Callable[[str], None],
    ) -> None:
        self.name, self.ring, self.path = name, ring, Path(path)
        self._progress, self._failed = progress, failed
        self._indices: deque[int] = deque()
        self._changed = threading.Condition()
        self._ended = self._stopped = False
        self.frames_written = 0
        self.error: str | None = None
        self.started = time.monotonic()
        self.seconds = 0.0
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"render-file-{name}", daemon=True)

    def start(self) -> RenderFile:
        self._thread.start()
        return self

    # -- as the stream's source -----------------------------------------------------------

    def put(self, index: int, speech: bool, anchor: float | None, segment: int) -> None:
        """Frame ``index`` is in its slot: written in its turn (the core fills no slot not yet released)."""
        with self._changed:
            self._indices.append(index)
            self._changed.notify_all()

    def end(self) -> None:
        """No frame follows: the file is finished once the last one is written."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def stats(self) -> dict[str, Any]:
        return {"frames_written": self.frames_written, "write_seconds": round(self.seconds, 3), "error": self.error}

    # -- as the stream's output -----------------------------------------------------------

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel: stop writing and close the file as it is (the service removes a cancelled job's file)."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def snapshot(self) -> dict[str, Any]:
        return self.stats()

    # -- the writing thread ---------------------------------------------------------------

    def _run(self) -> None:
        writer = None
        try:
            opening = time.monotonic()
            writer = Mp4Writer(create_recording(self.path), self.ring.width, self.ring.height)
            trace("worker").record(
                "render_file_opened", opening, s=self.name, ms=round((time.monotonic() - opening) * 1000, 2)
            )
            while (index := self._next()) is not None:
                frame = self.ring.read(index)
                if frame is None:
                    raise RuntimeError(f"frame {index} was overwritten before it was written out")
                writer.write_picture(frame[0])
                writer.write_audio(frame[1])
                self.ring.release(index)
                self.frames_written += 1
                if self.frames_written % PROGRESS_EVERY == 0:
                    self._progress(self.frames_written)
            writer.close()
            self._progress(self.frames_written)
        except Exception as exc:  # a full disk, a bad path: the job fails saying why
            self.error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)
            log.error("render %s: %s", self.name, self.error)
            self._failed(self.error)
            if writer is not None:
                try:
                    writer.close()
                except Exception:  # the file is already broken; the error above is what the client hears
                    pass
        finally:
            self.seconds = time.monotonic() - self.started
            self.finished.set()

    def _next(self) -> int | None:
        """The next frame index to write; None once ended and every frame written, or stopped."""
        with self._changed:
            self._changed.wait_for(lambda: self._indices or self._ended or self._stopped)
            if self._stopped or not self._indices:
                return None
            return self._indices.popleft()
